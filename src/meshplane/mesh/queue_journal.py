"""A node's queues on disk: a journal (``<data dir>/mesh/queues.log``), one JSON line per queue made,
changed or deleted, appended and fsynced before the change is applied (so a queue acknowledged as made
survives a crash), and compacted (rewritten whole, atomically) once it holds far more lines than there
are queues. Making a queue costs one short append, not a rewrite of every queue (10,000 queues made one
by one wrote ~1.5 GB as a whole-file ``queues.json``).

A failed append (ENOSPC, EIO) is cut off again, or, if even that fails, the next change rewrites the
journal whole: a torn line never has a line appended after it. On load a torn or unreadable line
(a crash mid-append: never acknowledged) is skipped and the journal rewritten without it. The
``queues.json`` of older versions is read once and replaced by the journal.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from meshplane.streams.files import changed, fsync_dir, write_atomic

log = logging.getLogger(__name__)

JOURNAL = "queues.log"
LEGACY = "queues.json"
COMPACT_AFTER = 1000  # lines beyond twice the queues' count before the journal is rewritten


class Entry(msgspec.Struct, omit_defaults=True):
    name: str
    patterns: list[str] = []  # none: the queue was deleted


_decode = msgspec.json.Decoder(Entry).decode
_encode = msgspec.json.Encoder().encode


class QueueJournal:
    def __init__(self, root: Path) -> None:
        self.path = root / JOURNAL
        self._legacy = root / LEGACY
        self._lines = 0
        self._fd: int | None = None
        self._rewrite = False  # the file may end in a torn line: rewrite it whole before appending

    def load(self) -> dict[str, list[str]]:
        """The queues (name -> patterns) as last recorded."""
        state: dict[str, list[str]] = {}
        try:
            state.update(msgspec.json.decode(self._legacy.read_bytes(), type=dict[str, list[str]]))
            legacy = True
        except FileNotFoundError:
            legacy = False
        except (OSError, msgspec.DecodeError) as exc:
            raise OSError(f"{self._legacy}: unreadable ({exc})") from exc
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        for line in data.splitlines():
            try:
                entry = _decode(line)
            except msgspec.DecodeError:
                log.warning("%s: skipped a torn or unreadable line", self.path)
                self._rewrite = True
                continue
            self._lines += 1
            if entry.patterns:
                state[entry.name] = entry.patterns
            else:
                state.pop(entry.name, None)
        if data and not data.endswith(b"\n"):
            self._rewrite = True
        if legacy or self._rewrite:
            self.compact(state)
        if legacy:
            self._legacy.unlink()
            fsync_dir(self._legacy.parent)
        return state

    def put(
        self, name: str, patterns: list[str], after: Callable[[], dict[str, list[str]]], count: int
    ) -> None:
        """Record ``name``'s ``patterns`` (none: deleted), durably; ``after()``: every queue once it
        applies (what a compaction writes), ``count`` about how many. Raises OSError with the line taken
        off again (if even that fails, a crash before the next change may keep it: the change's
        outcome is then unknown, as with any write whose fsync failed)."""
        if self._rewrite or self._lines > COMPACT_AFTER + 2 * count:
            self.compact(after())
            return
        created = self._fd is None and not self.path.exists()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        line = _encode(Entry(name, patterns)) + b"\n"
        size = os.fstat(self._fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
            if created:  # the file's name too must survive a power loss
                fsync_dir(self.path.parent)
        except OSError:
            self._cut(size)
            raise
        finally:
            changed(self.path)
        self._lines += 1

    def _cut(self, size: int) -> None:
        """Take a failed append off again; if that fails too, rewrite the journal at the next change."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, size)
            changed(self.path, cut=size)
        except OSError:
            self._rewrite = True
            self.close()

    def compact(self, state: dict[str, list[str]]) -> None:
        """Rewrite the journal as ``state``, whole or not at all (raises OSError)."""
        self.close()
        lines = [_encode(Entry(name, patterns)) + b"\n" for name, patterns in state.items()]
        write_atomic(self.path, b"".join(lines))
        self._lines, self._rewrite = len(lines), False

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
