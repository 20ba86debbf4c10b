"""An append-only file of lines, the shape of the node's small journals (queues, MQTT retained
messages): each change one line appended (fsynced when asked) and the file rewritten whole,
atomically, once it holds far more lines than the state it records.

A failed append (ENOSPC, EIO) is cut off again, or, if even that fails, the next change rewrites the
file whole: a torn line never has a line appended after it. On load a torn last line (a crash
mid-append: never acknowledged) is reported with :attr:`JournalFile.torn`, and its owner rewrites the
file without it. :meth:`append` is the whole of it for one line; a journal that shares fsyncs between
lines (the queues' group commit) uses the steps: :meth:`write`, :meth:`fsync`, :meth:`cut`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from meshplane.streams.files import _fsync_dir, changed, write_atomic


class JournalFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0  # lines in the file (what a compaction weighs against the state's size)
        self.torn = False  # the file may end in a torn line: rewrite it whole before appending
        self.size = 0  # where the next line goes (known once the file is open)
        self.created = False  # since the last fsync: its directory entry must be fsynced too
        self._fd: int | None = None

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def read(self) -> list[bytes]:
        """The file's lines (none if it is missing); sets :attr:`torn` when the last is unfinished."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        if data and not data.endswith(b"\n"):
            self.torn = True
        lines = data.splitlines()
        self.lines = len(lines)
        return lines

    def open(self) -> int:
        """The descriptor lines are appended to (the file opened, or created, at the first use)."""
        if self._fd is None:
            self.created = self.created or not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self.size = os.fstat(self._fd).st_size
        return self._fd

    def write(self, line: bytes) -> None:
        """Append ``line`` (ending in a newline), not fsynced. Raises OSError: the caller cuts the file
        back (:meth:`cut`) to where it was."""
        fd = self.open()
        try:
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                self.size += written
                view = view[written:]
        finally:
            changed(self.path)

    def fsync(self, fd: int, created: bool) -> None:
        """fsync ``fd`` (:meth:`open`'s) and, if the file was ``created`` since the last, its directory.
        Safe in a worker thread: the caller calls :meth:`synced` back on the loop."""
        os.fsync(fd)
        if created:  # the file's name too must survive a power loss
            _fsync_dir(self.path.parent)

    def append(self, line: bytes, sync: bool = True) -> None:
        """Append ``line`` (ending in a newline), fsynced with ``sync``. Raises OSError with the line
        taken off again (if even that fails, :attr:`torn` is set: the owner rewrites the file)."""
        fd = self.open()
        size = self.size
        try:
            self.write(line)
            if sync:
                created = self.created
                self.fsync(fd, created)
                self.synced(created)
        except OSError:
            self.cut(size)
            raise
        self.lines += 1

    def sync(self) -> None:
        """fsync what was appended without ``sync`` (raises OSError)."""
        if self._fd is not None:
            created = self.created
            self.fsync(self._fd, created)
            self.synced(created)

    def synced(self, created: bool) -> None:
        """An fsync made with ``created`` returned (on the loop)."""
        if created:
            changed(self.path.parent)
            self.created = False

    def cut(self, size: int) -> bool:
        """Take off everything past ``size``; False if even that failed (:attr:`torn` is then set and the
        file closed: the owner rewrites it whole)."""
        if self._fd is None:
            return False
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            self.torn = True
            self.close()
            return False
        self.size = size
        changed(self.path, cut=size)
        return True

    def replace(self, lines: list[bytes], sync: bool = True) -> None:
        """Rewrite the file as ``lines``, whole or not at all (raises OSError)."""
        self.close()
        write_atomic(self.path, b"".join(lines), sync=sync)
        self.lines, self.torn, self.created = len(lines), False, False

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
