"""One server per data directory: an exclusive ``flock`` on ``<data dir>/.lock``, held for the life of
the process and released by the kernel however the process ends (SIGKILL included).

A second ``meshplane serve`` on the same directory is refused with the holder's pid, unless it is a
**standby** (``--standby``): it waits for the lock and takes over, with everything the first one had
stored, as soon as the first one stops. Two processes sharing one data directory and one node id are
an HA pair (seed 002's mates, with a shared store: ActiveMQ Artemis's shared-store HA, IBM MQ's
multi-instance queue managers).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

from meshplane.errors import ConfigError

LOCK_FILE = ".lock"


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; True if this process holds it now."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        """The pid written by the process holding the lock (for messages)."""
        with contextlib.suppress(OSError):
            return self.path.read_text().strip() or "unknown"
        return "unknown"

    def acquire(self) -> None:
        if not self.try_acquire():
            raise ConfigError(
                f"the data directory {self.path.parent} is in use by another meshplane server (pid "
                f"{self.holder()}): stop it, use another --data-dir, or pass --standby to take over "
                "when it stops"
            )

    async def wait(self, stop: asyncio.Event, interval: float = 0.05) -> bool:
        """Wait for the lock (a standby); False if ``stop`` was set first."""
        while not self.try_acquire():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await stop.wait()
            if stop.is_set():
                return False
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
