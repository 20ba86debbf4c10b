"""File helpers of the streams storage: atomic metadata writes and a bounded pool of descriptors."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from meshplane.core.streamlog import encode_record, scan_records

log = logging.getLogger(__name__)

Watcher = Callable[[Path, "int | None", bool], None]
_watchers: list[Watcher] = []


def watch_changes(watcher: Watcher) -> None:
    """Hear of every path (file or directory) the storage changes: an HA mate's mirror."""
    _watchers.append(watcher)


def unwatch_changes(watcher: Watcher) -> None:
    with contextlib.suppress(ValueError):
        _watchers.remove(watcher)


def changed(path: Path, cut: int | None = None, synced: bool = False) -> None:
    """Called by every write, replacement and removal in a data directory; ``cut``: the file was
    truncated to that size (what follows may be rewritten, so a mirror resends from there);
    ``synced``: it was replaced whole and fsynced (a mirror makes its copy as durable)."""
    for watcher in _watchers:
        watcher(path, cut, synced)


def fsync_dir(directory: Path) -> None:
    """Make a create, rename or unlink in ``directory`` survive a machine crash."""
    changed(directory)
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, sync: bool = True, notify: bool = True) -> None:
    """Replace ``path`` with ``data`` whole or not at all: a temporary file, renamed over it.

    With ``sync`` the data and the rename are fsynced (a machine crash keeps one version or the
    other); a failure at any step leaves the old file as it was and no temporary behind. Without
    ``notify`` (a write in a worker thread: the watchers are the event loop's) the caller calls
    :func:`replaced` once back on the loop.
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
    try:
        if sync:
            _fsync_dir(path.parent)
    finally:
        if notify:
            replaced(path, sync)


async def sync_replaced(path: Path) -> None:
    """Make a file :func:`write_atomic` wrote without ``sync`` durable: its data and its name, both
    fsyncs at once in worker threads (the event loop keeps serving)."""

    def sync_file() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    await asyncio.gather(asyncio.to_thread(sync_file), asyncio.to_thread(_fsync_dir, path.parent))
    replaced(path, True)


def replaced(path: Path, synced: bool) -> None:
    """Tell the watchers ``path`` was replaced whole (by :func:`write_atomic`)."""
    changed(path, cut=0, synced=synced)  # new from its first byte (the inode number may be reused)
    if synced:
        changed(path.parent)


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


class RecordFile:
    """A small append-only file of records (the partition log's format): group commits, idempotency
    answers. An append is one ``write``, undone if it fails; a torn tail is cut when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.closed = False
        self.records = 0  # appended since the file was last rewritten
        self._fd: int | None = None
        self._size = 0

    def __repr__(self) -> str:
        return str(self.path)

    def load(self) -> list[bytes]:
        """The payloads of the valid records (a torn or garbled tail is cut off)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        result = scan_records(data, expected_offset=0)
        if result.valid_end < len(data):
            log.warning("%s: %s at byte %d; cut", self.path, result.problem, result.valid_end)
            os.truncate(self.path, result.valid_end)
        self._size, self.records = result.valid_end, len(result.records)
        return [r.payload for r in result.records]

    def append(self, payload: bytes) -> None:
        self.sync_fd()
        assert self._fd is not None
        record = encode_record(self.records, 0, payload)
        try:
            written = os.write(self._fd, record)
            if written != len(record):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(record)} bytes)")
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            changed(self.path, cut=self._size)
            raise
        self._size += len(record)
        self.records += 1
        changed(self.path)

    def rewrite(self, payloads: list[bytes], *, sync: bool = True) -> None:
        """Replace the file with these records, atomically (compaction)."""
        self.close()
        write_atomic(self.path, b"".join(encode_record(i, 0, p) for i, p in enumerate(payloads)), sync=sync)
        self.closed = False
        self.records, self._size = len(payloads), 0

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.records = 0
        changed(self.path)

    def sync_fd(self) -> int:
        """The open descriptor (opened on first use)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._size = os.fstat(self._fd).st_size
            self.closed = False
        return self._fd

    def close(self) -> None:
        self.closed = True
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
