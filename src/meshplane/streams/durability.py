"""Group commit: the fsync policy of the logs and the small files that acknowledge writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from meshplane.streams.config import FsyncPolicy
from meshplane.streams.errors import StorageError

log = logging.getLogger(__name__)


class Syncable(Protocol):
    """What the durability loop fsyncs: a partition log or a small record file."""

    closed: bool

    def sync_fd(self) -> int: ...


class Durability:
    """Group commit: appenders that need an fsync share one, run in a thread.

    ``interval``: data is on disk at most ``interval_ms`` after the first write not yet synced (Kafka's
    ``flush.ms``), sooner once ``every_records`` wait. Nothing runs while nothing is written. A failed
    fsync fails the writes waiting on that file (503) and is counted; the others are acknowledged.
    """

    def __init__(self, policy: FsyncPolicy, interval_ms: float, every_records: int) -> None:
        self.policy = policy
        self.interval = interval_ms / 1000
        self.every_records = every_records
        self._dirty: dict[Syncable, list[asyncio.Future[None]]] = {}
        self._pending_records = 0
        self._wake = asyncio.Event()  # something waits to be synced
        self._due = asyncio.Event()  # ... and it should be synced now
        self._task: asyncio.Task[None] | None = None
        self.fsyncs = 0
        self.fsync_errors = 0
        self.on_fsync: Callable[[float], None] | None = None
        # HA mates on other machines: returns once the standby has every change made before the call.
        self.replicate: Callable[[], Awaitable[None]] | None = None

    def start(self) -> None:
        if self.policy != "never" and self._task is None:
            self._task = asyncio.create_task(self._run(), name="meshplane-fsync")

    async def written(self, *targets: Syncable, records: int = 1) -> None:
        """Call after a write; with ``always`` this returns once it is on disk (or raises StorageError),
        with an HA mate once the mate has it too (whatever the policy)."""
        await self._written(targets, records)
        if self.replicate is not None:
            await self.replicate()

    def when_synced(self, *targets: Syncable) -> asyncio.Future[None]:
        """Done once what was written to ``targets`` so far is on disk (an exception if the fsync failed):
        with ``interval`` at the next fsync of the interval, with ``always`` at once (:meth:`written`
        waited for it), with ``never`` at once (nothing ever is)."""
        future = asyncio.get_running_loop().create_future()
        if self.policy != "interval" or not targets:
            future.set_result(None)
            return future
        for target in targets:
            self._dirty.setdefault(target, []).append(future)
        self._wake.set()
        return future

    async def _written(self, targets: tuple[Syncable, ...], records: int) -> None:
        if self.policy == "never":
            return
        self._wake.set()
        if self.policy == "always":
            future = asyncio.get_running_loop().create_future()
            for target in targets:
                self._dirty.setdefault(target, []).append(future)
            self._due.set()
            await future
        else:
            for target in targets:
                self._dirty.setdefault(target, [])
            self._pending_records += records
            if self.every_records and self._pending_records >= self.every_records:
                self._due.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if not self._due.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        await self._due.wait()
            self._wake.clear()
            self._due.clear()
            try:
                await self.flush()
            except Exception:  # the loop outlives a failed fsync: else nothing is ever synced again
                self.fsync_errors += 1
                log.exception("fsync failed")

    async def flush(self) -> None:
        dirty, self._dirty = self._dirty, {}
        self._pending_records = 0
        targets = [t for t in dirty if not t.closed]  # a deleted room or topic has nothing to sync
        failed: dict[Syncable, str] = {}
        if targets:
            # Duplicated descriptors: retention may close a segment while the thread syncs it.
            fds: list[tuple[Syncable, int]] = []
            for target in targets:
                try:
                    fds.append((target, os.dup(target.sync_fd())))
                except OSError as exc:
                    failed[target] = exc.strerror or str(exc)
            started = time.perf_counter()
            try:
                errors = await asyncio.to_thread(_fsync_each, [fd for _, fd in fds])
            except BaseException as exc:
                stopping = isinstance(exc, asyncio.CancelledError)
                why = "fsync cancelled: the server is stopping" if stopping else f"fsync failed ({exc!r})"
                for futures in dirty.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(StorageError(why))
                raise
            failed.update({target: error for (target, _), error in zip(fds, errors, strict=True) if error})
            if self.on_fsync:
                self.on_fsync(time.perf_counter() - started)
            self.fsyncs += 1
        if failed:
            self.fsync_errors += len(failed)
            log.error("fsync failed: %s", "; ".join(f"{t}: {e}" for t, e in failed.items()))
        # A write waiting on several files fails if any of them failed.
        for target, error in failed.items():
            for future in dirty.get(target, ()):
                if not future.done():
                    future.set_exception(
                        StorageError(
                            f"fsync failed ({error}): the write is not known to be on disk; "
                            "retry it (with an idempotency key, a retry cannot duplicate it)"
                        )
                    )
        for futures in dirty.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()


def _fsync_each(fds: list[int]) -> list[str | None]:
    """fsync each descriptor (and close it); the error of each, or None."""
    errors: list[str | None] = []
    for fd in fds:
        try:
            os.fsync(fd)
            errors.append(None)
        except OSError as exc:
            errors.append(exc.strerror or str(exc))
        finally:
            with contextlib.suppress(OSError):  # a duplicate: the fsync's answer is what counts
                os.close(fd)
    return errors
