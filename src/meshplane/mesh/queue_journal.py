"""A node's queues on disk: a journal (``<data dir>/mesh/queues.log``), one JSON line per queue made,
changed or deleted, appended and fsynced before the change is applied (so a queue acknowledged as made
survives a crash), and compacted (rewritten whole, atomically) once it holds far more lines than there
are queues. Making a queue costs one short append, not a rewrite of every queue (10,000 queues made one
by one wrote ~1.5 GB as a whole-file ``queues.json``).

Appends, cuts and rewrites are :class:`~meshplane.mesh.journal_file.JournalFile`'s. On load a torn or
unreadable line (a crash mid-append: never acknowledged) is skipped and the journal rewritten without it. The
``queues.json`` of older versions is read once and replaced by the journal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import msgspec

from meshplane.mesh.journal_file import JournalFile
from meshplane.streams.files import fsync_dir

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
        self.file = JournalFile(root / JOURNAL)
        self.path = self.file.path
        self._legacy = root / LEGACY

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
        for line in self.file.read():
            try:
                entry = _decode(line)
            except msgspec.DecodeError:
                log.warning("%s: skipped a torn or unreadable line", self.path)
                self.file.torn = True
                continue
            if entry.patterns:
                state[entry.name] = entry.patterns
            else:
                state.pop(entry.name, None)
        if legacy or self.file.torn:
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
        if self.file.torn or self.file.lines > COMPACT_AFTER + 2 * count:
            self.compact(after())
            return
        self.file.append(_encode(Entry(name, patterns)) + b"\n")

    def compact(self, state: dict[str, list[str]]) -> None:
        """Rewrite the journal as ``state``, whole or not at all (raises OSError)."""
        self.file.replace([_encode(Entry(name, patterns)) + b"\n" for name, patterns in state.items()])

    def close(self) -> None:
        self.file.close()
