"""The quiet stop of PySpark's streaming source runner: only a closed socket's exit is dropped."""

from __future__ import annotations

import sys
import types
from types import TracebackType

import pytest

from meshplane.spark import kafka_compat


def chained(*kinds: type[BaseException]) -> BaseException:
    """An exception raised while handling the one before it (the first is the innermost)."""
    exc: BaseException | None = None
    for kind in kinds:
        try:
            try:
                if exc is not None:
                    raise exc
            finally:
                raise kind()
        except BaseException as raised:
            exc = raised
    assert exc is not None
    return exc


def test_only_a_chain_of_closed_connections_counts_as_a_closed_socket() -> None:
    assert kafka_compat._closed_socket(chained(EOFError, BrokenPipeError, BrokenPipeError))
    assert kafka_compat._closed_socket(ConnectionResetError())
    assert not kafka_compat._closed_socket(chained(ValueError, BrokenPipeError))
    assert not kafka_compat._closed_socket(RuntimeError())


def test_the_hook_is_installed_in_the_runner_only_and_passes_other_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[type[BaseException]] = []

    def previous(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        seen.append(kind)

    monkeypatch.setattr(sys, "excepthook", previous)
    kafka_compat.quiet_runner_exit()
    assert sys.excepthook is previous  # not the runner: nothing changes
    runner = types.ModuleType("__main__")
    runner.__spec__ = types.SimpleNamespace(name=kafka_compat.STREAMING_RUNNER)  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "__main__", runner)
    kafka_compat.quiet_runner_exit()
    closed = chained(EOFError, BrokenPipeError)
    sys.excepthook(type(closed), closed, None)
    sys.excepthook(ValueError, ValueError("a real failure"), None)
    assert seen == [ValueError]
