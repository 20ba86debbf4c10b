"""A node's queues on disk: a journal (``<data dir>/mesh/queues.log``), one JSON line per queue made,
changed or deleted, appended and fsynced before the change is applied (so a queue acknowledged as made
survives a crash), and compacted (rewritten whole, atomically) once it holds far more lines than there
are queues. Making a queue costs one short append, not a rewrite of every queue (10,000 queues made one
by one wrote ~1.5 GB as a whole-file ``queues.json``).

Concurrent changes share an fsync (:meth:`QueueJournal.commit`, group commit): each appends its line on
the event loop and waits; one fsync in a worker thread covers every line appended before it began, the
next covers those that came meanwhile. A change is answered only once its line is durable.

A failed append or fsync (ENOSPC, EIO) is cut off again (every line the failed fsync may not have
covered, so each of their changes fails), or, if even that fails, the next change rewrites the
journal whole: a torn line never has a line appended after it. On load a torn or unreadable line
(a crash mid-append: never acknowledged) is skipped and the journal rewritten without it. The
``queues.json`` of older versions is read once and replaced by the journal.
"""

from __future__ import annotations

import asyncio
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
        self._legacy = root / LEGACY
        # Lines are numbered as appended; those up to ``_durable`` are on disk for good (but for
        # those a failed write or fsync took off again: ``_lost``).
        self._synced_size = 0  # the file's size when the last fsync began (a failed one cuts back to it)
        self._appended = 0
        self._durable = 0
        self._cuts = 0  # an fsync that began before a cut covers nothing
        self._compactions = 0  # ... nor one that began before a compaction (the new file holds its lines)
        self._committing: asyncio.Future[None] | None = None  # the fsync under way, in a worker thread
        self._pending: dict[int, Entry] = {}  # lines being committed, not yet applied by their caller
        self._lost: dict[int, OSError] = {}  # ... of those, the ones a failure took off again, and why

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
                log.warning("%s: skipped a torn or unreadable line", self.file.path)
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
        number = self._append(name, patterns, after, count)
        if number > self._durable:
            target, size, new_file, cuts = self._appended, self.file.size, self.file.created, self._cuts
            try:
                self.file.fsync(self._open_fd(), new_file)
            except OSError as exc:
                self._cut(exc)
                raise
            self._synced(target, size, new_file, cuts)

    async def commit(
        self, name: str, patterns: list[str], after: Callable[[], dict[str, list[str]]], count: int
    ) -> int:
        """:meth:`put`, its fsync shared with the lines committed meanwhile and made in a worker thread
        (the event loop keeps serving). Returns once the line is durable: its number, which the caller
        passes to :meth:`applied` once its change applies (until then a compaction writes it too). One
        change of a queue at a time."""
        number = self._append(name, patterns, after, count)
        self._pending[number] = Entry(name, patterns)
        try:
            while True:
                lost = self._lost.pop(number, None)
                if lost is not None:
                    raise lost
                if number <= self._durable:
                    return number
                if self._committing is None:
                    self._committing = asyncio.ensure_future(self._sync_appended())
                await asyncio.shield(self._committing)
        except BaseException:
            self.applied(number)
            raise

    def applied(self, number: int) -> None:
        """The change :meth:`commit` returned ``number`` for applies now (or never: its caller failed)."""
        self._pending.pop(number, None)
        self._lost.pop(number, None)

    async def _sync_appended(self) -> None:
        """One fsync for every line appended so far; a failed one takes off every line not durable (their
        callers raise its error)."""
        target, size, new_file, cuts = self._appended, self.file.size, self.file.created, self._cuts
        compactions = self._compactions
        try:
            await asyncio.to_thread(self.file.fsync, self._open_fd(), new_file)
        except OSError as exc:
            if cuts == self._cuts and compactions == self._compactions:
                self._cut(exc)
        else:  # unless a compaction (which made the lines durable) or a cut (which took them) came
            if compactions == self._compactions:
                self._synced(target, size, new_file, cuts)
        finally:
            self._committing = None

    def _append(
        self, name: str, patterns: list[str], after: Callable[[], dict[str, list[str]]], count: int
    ) -> int:
        """Append the line (or compact: durable at once); its number. Raises OSError with the line
        taken off again."""
        if self.file.torn or self.file.lines > COMPACT_AFTER + 2 * count:
            state = after()
            for number, entry in self._pending.items():  # appended, not yet applied: theirs too
                if number in self._lost:
                    continue
                if entry.patterns:
                    state[entry.name] = entry.patterns
                else:
                    state.pop(entry.name, None)
            self.compact(state)
            return self._durable
        self._open_fd()
        try:
            self.file.write(_encode(Entry(name, patterns)) + b"\n")
        except OSError as exc:
            self._cut(exc)
            raise
        self.file.lines += 1
        self._appended += 1
        return self._appended

    def _open_fd(self) -> int:
        if not self.file.is_open:  # what a reopened file holds was written whole (a compaction) or synced
            self.file.open()
            self._synced_size = self.file.size
        return self.file.open()

    def _synced(self, target: int, size: int, new_file: bool, cuts: int) -> bool:
        """An fsync that began at line ``target`` (the file ``size`` long) returned; False if a cut
        came meanwhile (what it covered may be gone)."""
        if cuts != self._cuts:
            return False
        self._durable = max(self._durable, target)
        self._synced_size = max(self._synced_size, size)
        self.file.synced(new_file)
        return True

    def _cut(self, error: OSError) -> None:
        """Take every line not yet durable off again (the commits waiting for them raise ``error``); if
        that fails, rewrite the journal at the next change."""
        self._cuts += 1
        for number in self._pending:
            if number > self._durable:
                self._lost[number] = error
        if self.file.is_open:  # else nothing was written since the file was last whole
            self.file.cut(self._synced_size)  # if even that fails, the next change rewrites it

    def compact(self, state: dict[str, list[str]]) -> None:
        """Rewrite the journal as ``state``, whole or not at all (raises OSError)."""
        self.file.replace([_encode(Entry(name, patterns)) + b"\n" for name, patterns in state.items()])
        self._compactions += 1
        self._durable = self._appended

    def close(self) -> None:
        self.file.close()
