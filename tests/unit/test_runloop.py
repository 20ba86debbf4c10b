"""MESHPLANE_LOOP: which loop the meshplane command runs on."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import uvloop

from meshplane import runloop
from meshplane.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "loop"), [(None, "asyncio"), ("", "asyncio"), ("asyncio", "asyncio"), (" UVLoop ", "uvloop")]
)
def test_the_loop_is_asyncio_unless_uvloop_is_asked_for(value: str | None, loop: str) -> None:
    assert runloop.chosen_loop({} if value is None else {"MESHPLANE_LOOP": value}) == loop


def test_an_unknown_loop_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="MESHPLANE_LOOP='trio' is not one of asyncio, uvloop"):
        runloop.chosen_loop({"MESHPLANE_LOOP": "trio"})


def test_run_runs_the_coroutine_on_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    monkeypatch.setenv("MESHPLANE_LOOP", "uvloop")
    assert runloop.run(loop_type()) is uvloop.Loop
    monkeypatch.setenv("MESHPLANE_LOOP", "asyncio")
    assert issubclass(runloop.run(loop_type()), asyncio.BaseEventLoop)


def test_a_refused_loop_leaves_no_coroutine_unawaited(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never() -> None:
        raise AssertionError("ran")

    monkeypatch.setenv("MESHPLANE_LOOP", "trio")
    coroutine = never()
    assert inspect.iscoroutine(coroutine)
    with pytest.raises(ConfigError):
        runloop.run(coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
