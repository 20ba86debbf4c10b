"""Polling helpers: wait for a condition with a timeout instead of sleeping and hoping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from meshplane import EventPlane, Scope


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "",
) -> None:
    """Poll ``condition`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or condition}")
        await asyncio.sleep(interval)


async def one_event_through(plane: EventPlane, scope: Scope, payload: bytes, topic: str = "t") -> bytes:
    """A subscriber and a publisher on ``plane``: once the publisher sees it, one event goes through;
    returns the payload the subscriber got."""
    sub = await plane.subscriber(scope, topic)
    pub = await plane.publisher(scope, topic)
    await pub.wait_for_subscribers(1, timeout=10)
    await pub.publish(payload)
    return (await sub.next(timeout=10)).payload


def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> None:
    """Synchronous :func:`eventually`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or condition}")
        time.sleep(interval)
