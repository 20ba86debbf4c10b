"""Fault injection for the storage tests: the n-th file operation under a directory fails.

The streams storage does all its file I/O through ``os`` functions (``os.open``, ``os.write``,
``os.fsync``, ``os.replace``, ``os.ftruncate``), so patching those in the process sees every write,
fsync and rename it makes; operations on other files (sockets, pytest's own) pass through untouched.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshplane.streams.service import StreamsService

OPERATIONS = ("open", "write", "fsync", "replace", "ftruncate")


class FaultInjector:
    """Counts operations on files under ``root``; the ``fail_at``-th (1-based) raises ``error``."""

    def __init__(self, root: Path, fail_at: int | None = None, error: int = errno.ENOSPC) -> None:
        self.root = str(root.resolve())
        self.fail_at = fail_at
        self.error = error
        self.count = 0
        self.failed: tuple[str, str] | None = None  # (operation, file) of the injected failure
        self.seen: list[tuple[str, str]] = []

    def _under_root(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def _check(self, operation: str, path: str) -> None:
        if not self._under_root(path):
            return
        self.count += 1
        self.seen.append((operation, path))
        if self.count == self.fail_at:
            self.failed = (operation, path)
            raise OSError(self.error, f"{os.strerror(self.error)} (injected)", path)

    @staticmethod
    def _fd_path(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    @contextmanager
    def installed(self) -> Iterator[FaultInjector]:
        originals: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name in OPERATIONS}

        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            self._check("open", os.path.abspath(os.fspath(path)))
            return int(originals["open"](path, flags, *args, **kwargs))

        def write(fd: int, data: Any) -> int:
            self._check("write", self._fd_path(fd))
            return int(originals["write"](fd, data))

        def fsync(fd: Any) -> None:
            self._check("fsync", self._fd_path(fd if isinstance(fd, int) else fd.fileno()))
            originals["fsync"](fd)

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            self._check("replace", os.path.abspath(os.fspath(dst)))
            originals["replace"](src, dst, *args, **kwargs)

        def ftruncate(fd: int, length: int) -> None:
            self._check("ftruncate", self._fd_path(fd))
            originals["ftruncate"](fd, length)

        patched = {"open": open_, "write": write, "fsync": fsync, "replace": replace, "ftruncate": ftruncate}
        for name, function in patched.items():
            setattr(os, name, function)
        try:
            yield self
        finally:
            for name, function in originals.items():
                setattr(os, name, function)


def crash(engine: StreamsService) -> None:
    """What kill -9 leaves: the files as written, nothing flushed or synced on the way out."""
    for task in (engine._cleanup, engine.durability._task):
        if task is not None:
            task.cancel()
    engine.files.close()
    engine.idempotency.close()
    engine.group_store.close()
