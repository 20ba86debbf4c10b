"""Small asyncio helpers shared by the adapters."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger(__name__)
_abandoned: set[asyncio.Future[Any]] = set()


async def cancel_and_wait(task: asyncio.Task[Any] | None, timeout: float = 2.0) -> None:
    """Cancel ``task`` and wait for it, but never longer than ``timeout``.

    Some clients cannot always be interrupted (aetcd's watch set-up can hold a lock through a
    cancellation); a close must not hang on them. A task that outlives the timeout is kept referenced
    until it finishes on its own.
    """
    if task is None or task.done():
        return
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        log.debug("task %s did not stop within %.1fs; leaving it to finish", task.get_name(), timeout)
        keep_until_done(task)
    elif not task.cancelled() and task.exception() is not None:
        log.debug("task %s ended with %r", task.get_name(), task.exception())


async def wait_at_most(awaitable: Awaitable[Any], timeout: float) -> None:
    """Run ``awaitable`` for at most ``timeout`` seconds; past that it goes on in the background
    (referenced until it ends, its outcome retrieved) and we move on."""
    task = asyncio.ensure_future(awaitable)
    await asyncio.wait({task}, timeout=timeout)
    if not task.done():
        keep_until_done(task)


def keep_until_done(task: asyncio.Future[Any]) -> None:
    """Keep a task we no longer wait for referenced until it ends (asyncio only holds weak
    references), and retrieve its outcome so that nothing is reported as never retrieved."""
    _abandoned.add(task)
    task.add_done_callback(_abandoned.discard)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
