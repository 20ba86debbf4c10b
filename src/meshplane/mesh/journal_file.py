"""An append-only file of lines, the shape of the node's small journals (queues, MQTT retained
messages): each change one line appended (fsynced when asked) and the file rewritten whole,
atomically, once it holds far more lines than the state it records.

A failed append (ENOSPC, EIO) is cut off again, or, if even that fails, the next change rewrites the
file whole: a torn line never has a line appended after it. On load a torn last line (a crash
mid-append: never acknowledged) is reported with :attr:`JournalFile.torn`, and its owner rewrites the
file without it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from meshplane.streams.files import changed, fsync_dir, write_atomic


class JournalFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0  # lines in the file (what a compaction weighs against the state's size)
        self.torn = False  # the file may end in a torn line: rewrite it whole before appending
        self._fd: int | None = None

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

    def append(self, line: bytes, sync: bool = True) -> None:
        """Append ``line`` (ending in a newline), fsynced with ``sync``. Raises OSError with the line
        taken off again (if even that fails, :attr:`torn` is set: the owner rewrites the file)."""
        created = self._fd is None and not self.path.exists()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
            if sync:
                os.fsync(self._fd)
            if created and sync:  # the file's name too must survive a power loss
                fsync_dir(self.path.parent)
        except OSError:
            self._cut(size)
            raise
        finally:
            changed(self.path)
        self.lines += 1

    def sync(self) -> None:
        """fsync what was appended without ``sync`` (raises OSError)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def _cut(self, size: int) -> None:
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, size)
            changed(self.path, cut=size)
        except OSError:
            self.torn = True
            self.close()

    def replace(self, lines: list[bytes], sync: bool = True) -> None:
        """Rewrite the file as ``lines``, whole or not at all (raises OSError)."""
        self.close()
        write_atomic(self.path, b"".join(lines), sync=sync)
        self.lines, self.torn = len(lines), False

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
