"""File helpers of the streams storage: atomic metadata writes and a bounded pool of descriptors."""

from __future__ import annotations

import contextlib
import os
import resource
from collections import OrderedDict
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a create, rename or unlink in ``directory`` survive a machine crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` whole or not at all: a temporary file, renamed over it.

    With ``sync`` the data and the rename are fsynced (a machine crash keeps one version or the
    other); a failure at any step leaves the old file as it was and no temporary behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        fsync_dir(path.parent)


def default_file_budget() -> int:
    """Descriptors the logs may keep open: half the soft RLIMIT_NOFILE (the rest is for sockets)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(soft // 2, 4096))


class FilePool:
    """Open segment files, at most ``capacity`` at once; the least recently used is closed first.

    Callers take ``fd()`` at the moment they use it and never keep it across another ``fd()`` call,
    which may close it.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = max(2, capacity or default_file_budget())
        self._open: OrderedDict[Path, int] = OrderedDict()
        self.opened = 0
        self.evicted = 0

    def fd(self, path: Path, *, create: bool = False) -> int:
        fd = self._open.get(path)
        if fd is not None:
            self._open.move_to_end(path)
            return fd
        while len(self._open) >= self.capacity:
            _, old = self._open.popitem(last=False)
            os.close(old)
            self.evicted += 1
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)
        self._open[path] = fd
        self.opened += 1
        return fd

    def release(self, path: Path) -> None:
        fd = self._open.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        while self._open:
            with contextlib.suppress(OSError):
                os.close(self._open.popitem()[1])

    def __len__(self) -> int:
        return len(self._open)
