"""A link that flaps keeps one retained catch-up, not one per coming up (each holds a copy of the
table's records, so a peer flapping its link could otherwise make a node hold the table many times)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from meshplane.mesh.doors import mqtt_retained
from meshplane.mesh.doors.mqtt_retained import RetainHolder


async def test_a_link_coming_up_again_replaces_its_running_catch_up(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never_done(holder: Any, link: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(mqtt_retained, "send_catch_up", never_done)
    door = SimpleNamespace(retained=SimpleNamespace(table=SimpleNamespace(entries=1)), tasks=set())
    holder = RetainHolder(door)  # type: ignore[arg-type]
    link, other = object(), object()
    for _ in range(50):
        holder.catch_up(link)  # type: ignore[arg-type]
    holder.catch_up(other)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    running = [task for task in door.tasks if not task.done()]
    assert len(running) == 2, "one catch-up per link"
    assert set(holder.catching_up) == {link, other}
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    assert holder.catching_up == {}, "a finished catch-up is forgotten"
