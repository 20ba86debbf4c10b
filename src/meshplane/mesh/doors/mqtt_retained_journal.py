"""The MQTT door's retained messages on disk: ``<data dir>/mesh/mqtt-retained.log``, one line per
record kept (:func:`meshplane.core.doors.mqtt_retained.encode_line`: a retained message or a clear,
with its stamp), appended through :class:`~meshplane.mesh.journal_file.JournalFile` (a failed append
cut off again, a torn last line dropped on load) and rewritten whole, atomically, once it holds far more
lines than the node holds records (so it stays within the store's bounds, about twice at most).

A line of this node's own retained PUBLISH is written before the PUBLISH is acknowledged, fsynced at
once with ``--fsync always``; with ``interval`` the door fsyncs it within a second; with ``never`` the
OS does. Lines of records learnt from peers are fsynced the same way, never one by one: their origin
holds them already.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from meshplane.core.doors.mqtt_retained import Record, decode_line, encode_line
from meshplane.mesh.journal_file import JournalFile

log = logging.getLogger(__name__)

JOURNAL = "mqtt-retained.log"
COMPACT_AFTER = 1000  # lines beyond twice the records' count before the journal is rewritten


class RetainedJournal:
    def __init__(self, root: Path, policy: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.file = JournalFile(root / JOURNAL)
        self.policy = policy  # the node's --fsync: always, interval or never
        self.unsynced = False

    def load(self) -> list[Record]:
        """The records as last written, oldest first (a later one of a topic wins when applied)."""
        records = []
        for line in self.file.read():
            record = decode_line(line)
            if record is None:
                log.warning("%s: skipped a torn or unreadable line", self.file.path)
                self.file.torn = True
            else:
                records.append(record)
        return records

    def put(self, record: Record, held: Callable[[], Iterable[Record]], count: int, own: bool) -> None:
        """Record ``record``; ``held()``: every record once it applies (what a compaction writes),
        ``count`` about how many; ``own``: this node's PUBLISH (fsynced now with ``always``). Raises
        OSError with nothing of it written."""
        sync = own and self.policy == "always"
        if self.file.torn or self.file.lines > COMPACT_AFTER + 2 * count:
            return self.compact(held())
        self.file.append(encode_line(record), sync=sync)
        self.unsynced = not sync and self.policy != "never"

    def compact(self, records: Iterable[Record]) -> None:
        """Rewrite the journal as ``records``, whole or not at all (raises OSError)."""
        self.file.replace([encode_line(r) for r in records], sync=self.policy != "never")
        self.unsynced = False

    def sync(self) -> None:
        """fsync what waits (the door's tick); a failure is logged and tried again next tick."""
        if self.unsynced:
            try:
                self.file.sync()
                self.unsynced = False
            except OSError as exc:
                log.warning("%s: fsync failed (%s): tried again in a second", self.file.path, exc)

    def close(self) -> None:
        self.file.close()
