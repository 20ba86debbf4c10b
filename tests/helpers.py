"""Polling helpers: wait for a condition with a timeout instead of sleeping and hoping, and read a child
process's output up to a line with a deadline."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import IO

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


def read_until(
    stream: IO[str] | None, done: str | Callable[[str], bool], timeout: float, what: str
) -> list[str]:
    """The lines of a child's ``stream`` up to and including the first that ``done`` matches (a regex,
    or a predicate). Read by a thread: a child that stops writing fails the test after ``timeout``
    seconds, naming ``what`` and showing what it wrote, instead of hanging it."""
    assert stream is not None
    matches = done if callable(done) else (lambda line: re.search(done, line) is not None)
    lines: list[str] = []
    finished = threading.Event()

    def read() -> None:
        try:
            for line in stream:
                lines.append(line)
                if matches(line):
                    break
        finally:
            finished.set()

    threading.Thread(target=read, daemon=True, name=f"read-until {what}").start()
    if not finished.wait(timeout):
        raise AssertionError(f"{what}: not within {timeout:g}s; it wrote:\n{''.join(lines)[-3000:]}")
    if not lines or not matches(lines[-1]):
        raise AssertionError(f"{what}: its output ended first:\n{''.join(lines)[-3000:]}")
    return lines
