"""The partition log on disk: segment files of records, a sparse offset index, recovery and retention.

Each segment is ``<base offset>.log`` (records, see :mod:`meshplane.core.streamlog`) plus
``<base offset>.index`` (pairs of u64 offset / u64 position every ``index_interval`` bytes). Appends
are ``os.write`` calls: once one returns, a process crash (kill -9) cannot lose the data, only a
machine crash can, which is what :meth:`PartitionLog.sync` (driven by the fsync policy) is for.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

from meshplane.core.streamlog import (
    HEADER_SIZE,
    Record,
    RetentionPolicy,
    SegmentInfo,
    encode_record,
    logical_start_offset,
    scan_records,
    segments_to_delete,
)

log = logging.getLogger(__name__)

INDEX_ENTRY = struct.Struct(">QQ")
READ_CHUNK = 1 << 20


@dataclass(slots=True)
class Segment:
    base_offset: int
    path: Path
    fd: int
    index_fd: int
    size: int = 0
    next_offset: int = 0
    last_timestamp_ms: int | None = None
    index_offsets: list[int] = field(default_factory=list)
    index_positions: list[int] = field(default_factory=list)
    bytes_since_index: int = 0

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".index")

    def info(self) -> SegmentInfo:
        return SegmentInfo(self.base_offset, self.next_offset, self.size, self.last_timestamp_ms)

    def index_entry_for(self, offset: int) -> tuple[int, int]:
        """The indexed (offset, position) at or before ``offset``."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return (self.index_offsets[i], self.index_positions[i]) if i >= 0 else (self.base_offset, 0)

    def add_index(self, offset: int, position: int) -> None:
        self.index_offsets.append(offset)
        self.index_positions.append(position)
        os.write(self.index_fd, INDEX_ENTRY.pack(offset, position))

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.index_fd)


def _segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


class PartitionLog:
    """One append-only log in one directory."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 64 * 1024 * 1024,
        index_interval: int = 4096,
        retention: RetentionPolicy | None = None,
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.index_interval = index_interval
        self.retention = retention or RetentionPolicy()
        self.segments: list[Segment] = []
        self.truncated_bytes = 0  # torn or corrupt bytes removed by recovery
        self.closed = False
        directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    # --- recovery ------------------------------------------------------------------------------------

    def _recover(self) -> None:
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        expected: int | None = None
        for n, base in enumerate(bases):
            path = self.directory / _segment_name(base)
            if expected is not None and base != expected:
                # A gap means the segments after it cannot be trusted to continue the sequence.
                log.error(
                    "log %s: segment %s does not continue at %d; removing it and later ones",
                    self.directory,
                    path.name,
                    expected,
                )
                for later in bases[n:]:
                    self._remove_files(self.directory / _segment_name(later))
                break
            segment = self._open_segment(base, path)
            problem = self._recover_segment(segment, active=n == len(bases) - 1)
            self.segments.append(segment)
            expected = segment.next_offset
            if problem and n < len(bases) - 1:
                log.error(
                    "log %s: %s in sealed segment %s; later segments removed",
                    self.directory,
                    problem,
                    path.name,
                )
                for later in bases[n + 1 :]:
                    self._remove_files(self.directory / _segment_name(later))
                break
        if not self.segments:
            self.segments.append(self._create_segment(0))

    def _open_segment(self, base: int, path: Path) -> Segment:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        index_fd = os.open(path.with_suffix(".index"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        return Segment(base, path, fd, index_fd, next_offset=base)

    def _recover_segment(self, segment: Segment, *, active: bool) -> str | None:
        """Find where the valid records end and truncate a torn or corrupt tail.

        The active segment is scanned whole and its index rebuilt (the index file may be ahead of
        or behind the data after a crash); sealed segments were fsynced when they were rolled, so
        their index is trusted and only the part after its last entry is scanned.
        """
        file_size = os.fstat(segment.fd).st_size
        if not active:
            raw_index = os.pread(segment.index_fd, os.fstat(segment.index_fd).st_size, 0)
            usable = len(raw_index) - len(raw_index) % INDEX_ENTRY.size
            for offset, position in INDEX_ENTRY.iter_unpack(raw_index[:usable]):
                if position >= file_size or offset < segment.base_offset:
                    break
                if segment.index_offsets and offset <= segment.index_offsets[-1]:
                    break
                segment.index_offsets.append(offset)
                segment.index_positions.append(position)
        start_offset, start = segment.base_offset, 0
        if segment.index_offsets:
            start_offset, start = segment.index_offsets[-1], segment.index_positions[-1]
        problem: str | None = None
        position, next_offset = start, start_offset
        since_index = 0
        while position < file_size:
            chunk = os.pread(segment.fd, READ_CHUNK, position)
            result = scan_records(chunk, start_position=position, expected_offset=next_offset)
            if (
                result.problem
                and result.problem.startswith("truncated")
                and position + len(chunk) < file_size
            ):
                # The chunk, not the file, ended mid-record.
                if not result.records:
                    whole = os.pread(segment.fd, 8 + struct.unpack_from(">I", chunk)[0], position)
                    result = scan_records(whole, start_position=position, expected_offset=next_offset)
                if result.records:
                    result = replace(result, problem=None)
            for record in result.records:
                if active and since_index >= self.index_interval:
                    segment.index_offsets.append(record.offset)
                    segment.index_positions.append(record.position)
                    since_index = 0
                since_index += record.size
            if result.records:
                next_offset = result.records[-1].offset + 1
                segment.last_timestamp_ms = result.records[-1].timestamp_ms
            position = result.valid_end
            if result.problem is not None:
                problem = result.problem
                break
        if position < file_size:
            log.warning(
                "log %s: %s at byte %d of %s; truncating %d bytes",
                self.directory,
                problem or "garbage",
                position,
                segment.path.name,
                file_size - position,
            )
            self.truncated_bytes += file_size - position
            os.ftruncate(segment.fd, position)
            problem = problem or "garbage"
        if active or problem:
            keep = bisect.bisect_left(segment.index_positions, position)
            del segment.index_offsets[keep:], segment.index_positions[keep:]
            os.ftruncate(segment.index_fd, 0)
            entries = zip(segment.index_offsets, segment.index_positions, strict=True)
            os.write(segment.index_fd, b"".join(INDEX_ENTRY.pack(o, p) for o, p in entries))
        segment.size = position
        segment.next_offset = next_offset
        segment.bytes_since_index = position - (segment.index_positions[-1] if segment.index_positions else 0)
        return problem

    def _create_segment(self, base: int) -> Segment:
        return self._open_segment(base, self.directory / _segment_name(base))

    @staticmethod
    def _remove_files(path: Path) -> None:
        for p in (path, path.with_suffix(".index")):
            p.unlink(missing_ok=True)

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
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def last_timestamp_ms(self) -> int | None:
        for segment in reversed(self.segments):
            if segment.last_timestamp_ms is not None:
                return segment.last_timestamp_ms
        return None

    # --- append and read -----------------------------------------------------------------------------

    def append(self, payloads: list[bytes], timestamp_ms: int) -> int:
        """Append records; returns the offset of the first. Durable against a process crash on return."""
        segment = self.active
        if segment.size and segment.size + sum(len(p) for p in payloads) > self.segment_bytes:
            self._roll()
            segment = self.active
        first = segment.next_offset
        offset = first
        parts: list[bytes] = []
        position = segment.size
        entries: list[tuple[int, int]] = []
        for payload in payloads:
            record = encode_record(offset, timestamp_ms, payload)
            if segment.bytes_since_index >= self.index_interval:
                entries.append((offset, position))
                segment.bytes_since_index = 0
            parts.append(record)
            position += len(record)
            segment.bytes_since_index += len(record)
            offset += 1
        blob = b"".join(parts)
        written = os.write(segment.fd, blob)
        if written != len(blob):  # a full disk; never leave a partial record behind
            os.ftruncate(segment.fd, segment.size)
            raise OSError(f"short write to {segment.path} ({written} of {len(blob)} bytes)")
        for entry in entries:  # after the data: an index entry never points past a write
            segment.add_index(*entry)
        segment.size = position
        segment.next_offset = offset
        segment.last_timestamp_ms = timestamp_ms
        return first

    def _roll(self) -> None:
        old = self.active
        os.fsync(old.fd)
        os.fsync(old.index_fd)
        self.segments.append(self._create_segment(old.next_offset))

    def sync(self) -> None:
        """fsync the active segment (rolled segments were synced when they were sealed)."""
        os.fsync(self.active.fd)

    def read(self, from_offset: int, max_records: int, max_bytes: int = READ_CHUNK) -> list[Record]:
        """Records from ``from_offset`` on (at most ``max_records``); the caller checks the range.

        ``max_bytes`` is a soft limit: the first record is returned whatever its size.
        """
        records: list[Record] = []
        offset = max(from_offset, self.segments[0].base_offset)
        while len(records) < max_records and max_bytes > 0:
            located = self._locate(offset)
            if located is None:
                break
            segment, position = located
            while position < segment.size and len(records) < max_records and max_bytes > 0:
                chunk = os.pread(
                    segment.fd, min(segment.size - position, max(max_bytes, HEADER_SIZE)), position
                )
                result = scan_records(chunk, start_position=position, max_records=max_records - len(records))
                if not result.records:
                    if records:
                        return records  # the next record alone exceeds what is left of the budget
                    chunk = os.pread(segment.fd, struct.unpack_from(">I", chunk)[0] + 8, position)
                    result = scan_records(chunk, start_position=position, max_records=1)
                    if not result.records:
                        raise OSError(f"unreadable record at byte {position} of {segment.path}")
                records.extend(result.records)
                max_bytes -= result.valid_end - position
                position = result.valid_end
            offset = segment.next_offset
        return records

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
        """Where :meth:`read_raw`'s bytes are: (segment, position, length); None past the end."""
        located = self._locate(max(from_offset, self.segments[0].base_offset))
        if located is None:
            return None
        segment, position = located
        count = min(segment.size - position, max_bytes)
        if count < segment.size - position:  # the first record must be whole, however long
            first = struct.unpack(">I", os.pread(segment.fd, 4, position))[0] + 8
            count = max(count, first)
        return segment, position, count

    def _locate(self, offset: int) -> tuple[Segment, int] | None:
        """The segment holding ``offset`` and the exact position of its record (None: past the end)."""
        i = bisect.bisect_right([s.base_offset for s in self.segments], offset) - 1
        while 0 <= i < len(self.segments) and offset >= self.segments[i].next_offset:
            i += 1
        if i < 0 or i >= len(self.segments):
            return None
        segment = self.segments[i]
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
            pos += struct.unpack_from(">I", buffer, pos)[0] + 8
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
        return removed

    def delete(self) -> None:
        self.close()
        for segment in self.segments:
            self._remove_files(segment.path)
        with contextlib.suppress(OSError):
            self.directory.rmdir()

    def close(self) -> None:
        self.closed = True
        for segment in self.segments:
            with contextlib.suppress(OSError):
                segment.close()
