"""The partition log on disk: segment files of records, a sparse offset index, recovery and retention.

Each segment is ``<base offset>.log`` (records, see :mod:`meshplane.core.streamlog`). The active
(last) segment's sparse index lives in memory and is rebuilt by scanning it on start; when a segment is
sealed its index is written whole to ``<base offset>.index`` (atomically) and trusted from then on.

Appends are one ``os.write``: once it returns, a process crash (kill -9) cannot lose the data, only a
machine crash can, which is what :meth:`PartitionLog.sync` (driven by the fsync policy) is for. An
append that fails at any step is undone (the file truncated back, nothing in memory moved) and raises
:class:`StorageError`; if even the undo fails, the log rescans its tail before the next append, so
an offset is never given twice.

Corruption is kept to where it is: a bad record with good records after it becomes a :class:`Hole`
(reads of its offsets raise :class:`CorruptRecords`, which says where reading can go on); a bad tail
of the active segment (a torn write) is moved to ``quarantine/`` and cut off; later segments are
never dropped for a bad record in an earlier one.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from meshplane.core.streamlog import (
    HEADER_SIZE,
    Hole,
    Record,
    RetentionPolicy,
    encode_record,
    logical_start_offset,
    record_size,
    scan_records,
    segments_to_delete,
)
from meshplane.streams.errors import CorruptRecords, StorageError, storage_error
from meshplane.streams.files import FilePool, changed, fsync_dir, write_atomic
from meshplane.streams.segments import (
    QUARANTINE,
    READ_CHUNK,
    LogMark,
    Segment,
    SegmentRecovery,
)

log = logging.getLogger(__name__)


class PartitionLog(SegmentRecovery):
    """One append-only log in one directory."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 64 * 1024 * 1024,
        index_interval: int = 4096,
        retention: RetentionPolicy | None = None,
        files: FilePool | None = None,
        before_seal: Callable[[], None] | None = None,
    ) -> None:
        self.directory = directory
        # Run before a segment is sealed (fsynced for good): the idempotency answers of the events in
        # it must be on disk first, since only the active segment is searched for them after a crash.
        self.before_seal = before_seal
        self.segment_bytes = segment_bytes
        self.index_interval = index_interval
        self.retention = retention or RetentionPolicy()
        self.files = files if files is not None else FilePool(64)
        self.segments: list[Segment] = []
        self.holes: list[Hole] = []  # sorted by offset
        self.truncated_bytes = 0  # torn or corrupt bytes moved out by recovery
        self.problems: list[str] = []  # what recovery and verification found, for stats and logs (the last)
        self.problems_total = 0
        self.closed = False
        self._needs_rescan = False
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._recover()
        except OSError as exc:
            self.close()
            raise storage_error(exc, f"opening the log {directory}") from exc

    def __repr__(self) -> str:
        return f"log {self.directory}"

    # --- positions -----------------------------------------------------------------------------------

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def next_offset(self) -> int:
        return self.active.next_offset

    @property
    def start_offset(self) -> int:
        """The oldest readable offset."""
        return logical_start_offset(self.segments[0].base_offset, self.next_offset, self.retention)

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def last_timestamp_ms(self) -> int | None:
        for segment in reversed(self.segments):
            if segment.last_timestamp_ms is not None:
                return segment.last_timestamp_ms
        return None

    def sync_fd(self) -> int:
        """The descriptor an fsync of the unsynced appends needs (rolled segments were synced)."""
        return self.active.fd

    # --- append and read -----------------------------------------------------------------------------

    def mark(self) -> LogMark:
        if self._needs_rescan:
            self._rescan_active()
        a = self.active
        return LogMark(
            len(self.segments),
            a.size,
            a.next_offset,
            len(a.index_offsets),
            a.bytes_since_index,
            a.last_timestamp_ms,
        )

    def undo(self, mark: LogMark) -> None:
        """Take back appends made since ``mark`` (all in one synchronous step: nobody read them)."""
        segment = self.active
        same = len(self.segments) == mark.segments
        size = mark.size if same else 0
        try:
            os.ftruncate(segment.fd, size)
        except OSError as exc:
            # The records stay in the file: rescan before the next append so that their offsets
            # are never given again.
            log.error("log %s: cannot undo a failed append (%s); rescanning", self.directory, exc)
            self._needs_rescan = True
        segment.size = size
        changed(segment.path, cut=size)
        if same:
            segment.next_offset = mark.next_offset
            del segment.index_offsets[mark.index_entries :], segment.index_positions[mark.index_entries :]
            segment.bytes_since_index = mark.bytes_since_index
            segment.last_timestamp_ms = mark.last_timestamp_ms
        else:  # a fresh segment rolled for the undone append: empty again
            segment.next_offset = segment.base_offset
            segment.index_offsets.clear()
            segment.index_positions.clear()
            segment.bytes_since_index = 0
            segment.last_timestamp_ms = None

    def append(self, payloads: list[bytes], timestamp_ms: int) -> int:
        """Append records; returns the offset of the first. Durable against a process crash on return;
        on failure nothing was appended and :class:`StorageError` says why."""
        mark = self.mark()
        try:
            first = self._append(payloads, timestamp_ms)
        except OSError as exc:
            self.undo(mark)
            raise storage_error(exc, f"append to {self.directory}") from exc
        changed(self.directory)
        return first

    def _append(self, payloads: list[bytes], timestamp_ms: int) -> int:
        # Stamps never go back (a clock set back stamps with the last time): offset_for_time searches.
        timestamp_ms = max(timestamp_ms, self.last_timestamp_ms or 0)
        segment = self.active
        if segment.size and segment.size + sum(len(p) for p in payloads) > self.segment_bytes:
            self._roll()
            segment = self.active
        first = segment.next_offset
        offset = first
        parts: list[bytes] = []
        position = segment.size
        for payload in payloads:
            record = encode_record(offset, timestamp_ms, payload)
            if segment.bytes_since_index >= self.index_interval:
                segment.index_offsets.append(offset)
                segment.index_positions.append(position)
                segment.bytes_since_index = 0
            parts.append(record)
            position += len(record)
            segment.bytes_since_index += len(record)
            offset += 1
        blob = b"".join(parts)
        written = os.write(segment.fd, blob)
        if written != len(blob):  # a full disk wrote part of it
            raise OSError(28, f"short write ({written} of {len(blob)} bytes)")
        segment.size = position
        segment.next_offset = offset
        segment.last_timestamp_ms = timestamp_ms
        return first

    def _rescan_active(self) -> None:
        segment = self.active
        try:
            self._scan(segment, active=True)
        except OSError as exc:
            raise storage_error(exc, f"recovering the log {self.directory}") from exc
        self._needs_rescan = False

    def _roll(self) -> None:
        """Seal the active segment (data fsynced, index written whole) and start the next one."""
        old = self.active
        if self.before_seal is not None:
            self.before_seal()
        os.fsync(old.fd)
        write_atomic(old.index_path, old.index_bytes())
        old.verified, old.verified_offset = old.size, old.next_offset  # written by this process
        segment = self._create_segment(old.next_offset)
        try:
            fsync_dir(self.directory)
        except OSError:
            self.files.release(segment.path)
            with contextlib.suppress(OSError):
                segment.path.unlink()
            raise
        self.segments.append(segment)

    def sync(self) -> None:
        """fsync the active segment (rolled segments were synced when they were sealed)."""
        os.fsync(self.active.fd)

    def hole_at(self, offset: int) -> Hole | None:
        i = bisect.bisect_right(self.holes, offset, key=lambda h: h.first) - 1
        if i >= 0 and offset < self.holes[i].end:
            return self.holes[i]
        return None

    def _next_hole_from(self, offset: int) -> Hole | None:
        i = bisect.bisect_right(self.holes, offset, key=lambda h: h.first)
        return self.holes[i] if i < len(self.holes) else None

    def _corrupt(self, offset: int, hole: Hole) -> CorruptRecords:
        return CorruptRecords(offset, hole.first, hole.end, str(self.directory))

    def read(self, from_offset: int, max_records: int, max_bytes: int = READ_CHUNK) -> list[Record]:
        """Records from ``from_offset`` on (at most ``max_records``); the caller checks the range.

        ``max_bytes`` is a soft limit: the first record is returned whatever its size. Reading stops
        before unreadable records; starting on one raises :class:`CorruptRecords`.
        """
        records: list[Record] = []
        offset = max(from_offset, self.segments[0].base_offset)
        hole = self.hole_at(offset)
        if hole is not None:
            raise self._corrupt(offset, hole)
        next_hole = self._next_hole_from(offset)
        while len(records) < max_records and max_bytes > 0:
            if next_hole is not None and offset >= next_hole.first:
                break
            located = self._locate(offset)
            if located is None:
                break
            segment, position = located
            end = self._readable_end(segment, next_hole)
            while position < end and len(records) < max_records and max_bytes > 0:
                chunk = os.pread(segment.fd, min(end - position, max(max_bytes, HEADER_SIZE)), position)
                result = scan_records(chunk, start_position=position, max_records=max_records - len(records))
                if not result.records:
                    if records:
                        return records  # the next record alone exceeds what is left of the budget
                    chunk = os.pread(segment.fd, min(record_size(chunk), end - position), position)
                    result = scan_records(chunk, start_position=position, max_records=1)
                    if not result.records:
                        raise self._found_corrupt(segment, position, offset)
                records.extend(result.records)
                max_bytes -= result.valid_end - position
                position = result.valid_end
                offset = records[-1].offset + 1
                if result.problem is not None and not result.problem.startswith("truncated"):
                    if records:
                        return records
                    raise self._found_corrupt(segment, position, offset)
            if position >= segment.size:
                offset = segment.next_offset
        return records

    def offset_for_time(self, timestamp_ms: int) -> int:
        """The first readable offset stamped at or after ``timestamp_ms``; the log end when none is.

        Stamps never decrease, so: the first segment whose last stamp reaches the time, a binary
        search over its index entries, then at most one index interval of records read.
        """
        start = self.start_offset
        for segment in self.segments:
            if segment.next_offset <= start or (segment.last_timestamp_ms or -1) < timestamp_ms:
                continue
            probes = sorted({max(o, start) for o in (segment.base_offset, *segment.index_offsets)})
            low, high = 0, len(probes)  # the first probe stamped at or after the time
            while low < high:
                middle = (low + high) // 2
                probe = self.read(probes[middle], 1)
                if not probe or probe[0].timestamp_ms >= timestamp_ms:
                    high = middle
                else:
                    low = middle + 1
            offset = probes[max(low - 1, 0)]
            while offset < segment.next_offset:
                records = self.read(offset, 10_000, self.index_interval + 4096)
                for record in records:
                    if record.timestamp_ms >= timestamp_ms:
                        return record.offset
                if not records:
                    break
                offset = records[-1].offset + 1
        return self.next_offset

    @staticmethod
    def _readable_end(segment: Segment, hole: Hole | None) -> int:
        """Where the readable bytes of ``segment`` end: its size, or the start of a hole inside it."""
        inside = hole is not None and segment.base_offset <= hole.first < segment.next_offset
        if hole is not None and inside and hole.end_position > hole.position:
            return hole.position
        return segment.size

    def _found_corrupt(self, segment: Segment, position: int, offset: int) -> CorruptRecords:
        """A record that failed its check at read time (a sealed segment not yet verified)."""
        resumed_at, resumed_offset = self._skip_bad(segment, position, offset)
        self._report(
            f"unreadable record at byte {position} of {segment.path.name}: offsets "
            f"{offset}..{resumed_offset - 1} set aside"
        )
        hole = Hole(offset, resumed_offset, position, resumed_at)
        self._add_hole(hole)
        if resumed_at < segment.size:
            segment.add_index(resumed_offset, resumed_at)
        return self._corrupt(offset, hole)

    def read_raw(self, from_offset: int, max_bytes: int) -> bytes:
        """Record bytes from ``from_offset`` on, for clients that decode records themselves.

        Whole records from one segment; the last one may be cut by ``max_bytes`` (a client drops
        it and asks again from there), but the first is always whole.
        """
        span = self.raw_span(from_offset, max_bytes)
        if span is None:
            return b""
        segment, position, count = span
        return os.pread(segment.fd, count, position)

    def raw_span(self, from_offset: int, max_bytes: int) -> tuple[Segment, int, int] | None:
        """Where :meth:`read_raw`'s bytes are: (segment, position, length); None past the end.
        The span stops before unreadable records; starting on one raises :class:`CorruptRecords`.

        Bytes of a sealed segment are crc-checked before they are first handed out raw (readers of
        raw bytes trust them), unless the background verification got there first.
        """
        while True:
            offset = max(from_offset, self.segments[0].base_offset)
            hole = self.hole_at(offset)
            if hole is not None:
                raise self._corrupt(offset, hole)
            located = self._locate(offset)
            if located is None:
                return None
            segment, position = located
            end = self._readable_end(segment, self._next_hole_from(offset))
            count = min(end - position, max_bytes)
            if count < end - position:  # the first record must be whole, however long
                first = record_size(os.pread(segment.fd, 4, position))
                count = max(count, min(first, end - position))
            if segment is self.active or segment.verified >= position + count:
                return segment, position, count
            while segment.verified < min(position + count, segment.size):
                self._verify_chunk(segment)  # then look again: a hole may have been found

    def _locate(self, offset: int) -> tuple[Segment, int] | None:
        """The segment holding ``offset`` and the exact position of its record (None: past the end)."""
        i = bisect.bisect_right([s.base_offset for s in self.segments], offset) - 1
        while 0 <= i < len(self.segments) and offset >= self.segments[i].next_offset:
            i += 1
        if i < 0 or i >= len(self.segments):
            return None
        segment = self.segments[i]
        offset = max(offset, segment.base_offset)
        at, position = segment.index_entry_for(offset)
        if at == offset:
            return segment, position
        # Walk record headers from the index entry: at most index_interval bytes away.
        buffer = os.pread(segment.fd, min(segment.size - position, self.index_interval + (1 << 16)), position)
        pos = 0
        while at < offset:
            if pos + 4 > len(buffer):
                buffer = os.pread(segment.fd, min(segment.size - position - pos, 1 << 20), position + pos)
                position, pos = position + pos, 0
                if len(buffer) < 4:
                    raise self._found_corrupt(segment, position, at)
            pos += record_size(buffer, pos)
            at += 1
        return segment, position + pos

    # --- retention -----------------------------------------------------------------------------------

    def apply_retention(self, now_ms: int, keep_from: int | None = None) -> int:
        """Delete whole segments that retention (or ``keep_from``, everything below it) allows.

        Returns the number of records removed.
        """
        count = segments_to_delete([s.info() for s in self.segments], self.retention, now_ms)
        if keep_from is not None:
            while count < len(self.segments) - 1 and self.segments[count].next_offset <= keep_from:
                count += 1
        removed = 0
        for segment in self.segments[:count]:
            segment.close()
            self._remove_files(segment.path)
            removed += segment.next_offset - segment.base_offset
        del self.segments[:count]
        if count:
            changed(self.directory)
        first = self.segments[0].base_offset
        self.holes = [h for h in self.holes if h.end > first]
        return removed

    @staticmethod
    def _remove_files(path: Path) -> None:
        for p in (path, path.with_suffix(".index")):
            p.unlink(missing_ok=True)

    def delete(self) -> None:
        self.close()
        for segment in self.segments:
            self._remove_files(segment.path)
        for path in self.directory.glob(f"{QUARANTINE}/*"):
            path.unlink(missing_ok=True)
        for path in (self.directory / QUARANTINE, self.directory):
            with contextlib.suppress(OSError):
                path.rmdir()
        changed(self.directory)

    def close(self) -> None:
        self.closed = True
        for segment in self.segments:
            segment.close()


__all__ = ["CorruptRecords", "PartitionLog", "Segment", "StorageError"]
