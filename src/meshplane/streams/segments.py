"""Segments of a partition log, and how a log finds its valid records when it opens (recovery) and
checks its sealed segments later (verification).

A bad record with good records after it becomes a :class:`~meshplane.core.streamlog.Hole`; a bad tail
(a torn write) is copied to ``quarantine/`` and cut off; later segments are never dropped.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshplane.core.streamlog import (
    HEADER_SIZE,
    Hole,
    Record,
    SegmentInfo,
    record_offset,
    record_size,
    resync,
    scan_records,
)
from meshplane.streams.files import FilePool, changed, write_atomic

log = logging.getLogger(__name__)

INDEX_ENTRY = struct.Struct(">QQ")
READ_CHUNK = 1 << 20
QUARANTINE = "quarantine"


@dataclass(slots=True)
class Segment:
    base_offset: int
    path: Path
    files: FilePool
    size: int = 0
    next_offset: int = 0
    last_timestamp_ms: int | None = None
    index_offsets: list[int] = field(default_factory=list)
    index_positions: list[int] = field(default_factory=list)
    bytes_since_index: int = 0
    verified: int = 0  # records before this position had their crc checked since start
    verified_offset: int = 0  # the offset of the record at ``verified``

    @property
    def fd(self) -> int:
        """The open descriptor; take it where it is used, never keep it (the pool may close it)."""
        return self.files.fd(self.path)

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
        i = bisect.bisect_left(self.index_offsets, offset)
        if i < len(self.index_offsets) and self.index_offsets[i] == offset:
            return
        self.index_offsets.insert(i, offset)
        self.index_positions.insert(i, position)

    def index_bytes(self) -> bytes:
        entries = zip(self.index_offsets, self.index_positions, strict=True)
        return b"".join(INDEX_ENTRY.pack(o, p) for o, p in entries)

    def close(self) -> None:
        self.files.release(self.path)


@dataclass(frozen=True, slots=True)
class LogMark:
    """The active segment's state before an append, to undo it."""

    segments: int
    size: int
    next_offset: int
    index_entries: int
    bytes_since_index: int
    last_timestamp_ms: int | None


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


class SegmentRecovery:
    """Recovery and verification of a :class:`~meshplane.streams.log.PartitionLog`'s segments."""

    directory: Path
    files: FilePool
    index_interval: int
    segments: list[Segment]
    holes: list[Hole]
    problems: list[str]
    problems_total: int
    truncated_bytes: int

    def _recover(self) -> None:
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        for n, base in enumerate(bases):
            path = self.directory / segment_name(base)
            expected = self.segments[-1].next_offset if self.segments else None
            if expected is not None and base < expected:
                # Its first offsets are already in the previous segment: keep the files aside.
                self._report(f"segment {path.name} overlaps the one before it (which ends at {expected})")
                self._quarantine_file(path)
                self._quarantine_file(path.with_suffix(".index"))
                continue
            if expected is not None and base > expected:
                self._report(f"offsets {expected}..{base - 1} are missing (no segment holds them)")
                self.holes.append(Hole(expected, base, 0, 0))
            segment = Segment(base, path, self.files, next_offset=base)
            if n < len(bases) - 1:
                self._load_index(segment)
            self._scan(segment, active=n == len(bases) - 1)
            self.segments.append(segment)
        if not self.segments:
            self.segments.append(self._create_segment(0))

    def _load_index(self, segment: Segment) -> None:
        """A sealed segment's index, as far as it is consistent (a torn or garbled index is cut)."""
        try:
            fd = os.open(segment.index_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            raw = os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
        file_size = os.fstat(segment.fd).st_size
        usable = len(raw) - len(raw) % INDEX_ENTRY.size
        for offset, position in INDEX_ENTRY.iter_unpack(raw[:usable]):
            if position >= file_size or offset < segment.base_offset:
                break
            if segment.index_offsets and (
                offset <= segment.index_offsets[-1] or position <= segment.index_positions[-1]
            ):
                break
            segment.index_offsets.append(offset)
            segment.index_positions.append(position)

    def _scan(self, segment: Segment, *, active: bool) -> None:
        """Find where the valid records end: from the last index entry of a sealed segment (its
        records before that are checked later, by :meth:`verify_step`), the whole active segment.

        A bad record followed by good ones becomes a hole; a bad tail is quarantined and cut off.
        """
        file_size = os.fstat(segment.fd).st_size
        if not active and segment.index_offsets:
            next_offset, position = segment.index_offsets[-1], segment.index_positions[-1]
        else:
            segment.index_offsets.clear()
            segment.index_positions.clear()
            next_offset, position = segment.base_offset, 0
        since_index = 0
        while position < file_size:
            records, end, problem = self._read_valid(segment, position, next_offset, file_size)
            for record in records:
                if since_index >= self.index_interval:
                    segment.add_index(record.offset, record.position)
                    since_index = 0
                since_index += record.size
            if records:
                next_offset = records[-1].offset + 1
                segment.last_timestamp_ms = records[-1].timestamp_ms
            position = end
            if problem is None:
                continue
            found = self._resync(segment, position, next_offset, file_size)
            if found is None:  # nothing valid after it: a torn or garbled tail
                self._report(f"{problem} at byte {position} of {segment.path.name}: tail set aside")
                self._quarantine_tail(segment, position, file_size)
                file_size = position
                break
            resumed_at, resumed_offset = found
            self._report(
                f"{problem} at byte {position} of {segment.path.name}: offsets "
                f"{next_offset}..{resumed_offset - 1} unreadable, records go on at {resumed_offset}"
            )
            self._add_hole(Hole(next_offset, resumed_offset, position, resumed_at))
            segment.add_index(resumed_offset, resumed_at)
            position, next_offset, since_index = resumed_at, resumed_offset, 0
        segment.size = position
        segment.next_offset = next_offset
        segment.bytes_since_index = position - (segment.index_positions[-1] if segment.index_positions else 0)
        if active or not segment.index_offsets:
            segment.verified, segment.verified_offset = position, next_offset
        else:
            segment.verified, segment.verified_offset = 0, segment.base_offset

    def _read_valid(
        self, segment: Segment, position: int, expected: int, file_size: int
    ) -> tuple[list[Record], int, str | None]:
        """Valid records from ``position`` (one read chunk): (records, where they end, problem)."""
        chunk = os.pread(segment.fd, min(READ_CHUNK, file_size - position), position)
        result = scan_records(chunk, start_position=position, expected_offset=expected)
        problem = result.problem
        if problem and problem.startswith("truncated") and position + len(chunk) < file_size:
            if result.records:  # the chunk, not the file, ended mid-record
                problem = None
            else:  # one record longer than a chunk
                whole = os.pread(segment.fd, min(record_size(chunk), file_size - position), position)
                result = scan_records(whole, start_position=position, expected_offset=expected)
                problem = result.problem
        return result.records, result.valid_end, problem

    def _resync(
        self, segment: Segment, position: int, expected: int, file_size: int
    ) -> tuple[int, int] | None:
        """(position, offset) of the first good record after a bad one at ``position``, if any."""
        following = self._next_base_after(segment)
        max_offset = None if following is None else following - 1
        step = READ_CHUNK
        at = position + 1
        while at < file_size:
            chunk = os.pread(segment.fd, min(step + (1 << 16), file_size - at), at)
            found = resync(chunk, start_position=at, min_offset=expected, max_offset=max_offset)
            if found is not None:
                offset = record_offset(os.pread(segment.fd, HEADER_SIZE, found))
                return found, offset
            at += step
        return None

    def _next_base_after(self, segment: Segment) -> int | None:
        names = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        later = [b for b in names if b > segment.base_offset]
        return later[0] if later else None

    def _add_hole(self, hole: Hole) -> None:
        if any(h.first == hole.first for h in self.holes):
            return
        bisect.insort(self.holes, hole, key=lambda h: h.first)

    def _report(self, problem: str) -> None:
        log.error("log %s: %s", self.directory, problem)
        self.problems_total += 1
        self.problems.append(problem)
        del self.problems[:-100]

    def _quarantine_tail(self, segment: Segment, position: int, file_size: int) -> None:
        """Copy bytes ``position..`` of the segment aside (for inspection), then cut them off."""
        tail = os.pread(segment.fd, file_size - position, position)
        try:
            folder = self.directory / QUARANTINE
            folder.mkdir(exist_ok=True)
            write_atomic(folder / f"{segment.path.name}.{position}.{time.time_ns()}", tail)
        except OSError as exc:  # a full disk: the tail must go all the same, or the log cannot go on
            self._report(f"could not set {len(tail)} bytes aside ({exc}); cut off")
        os.ftruncate(segment.fd, position)
        changed(segment.path, cut=position)
        self.truncated_bytes += len(tail)

    def _quarantine_file(self, path: Path) -> None:
        if path.exists():
            folder = self.directory / QUARANTINE
            folder.mkdir(exist_ok=True)
            os.replace(path, folder / f"{path.name}.{time.time_ns()}")
            changed(self.directory)

    def _create_segment(self, base: int) -> Segment:
        segment = Segment(base, self.directory / segment_name(base), self.files, next_offset=base)
        self.files.fd(segment.path, create=True)
        return segment

    # --- verification --------------------------------------------------------------------------------

    def verify_step(self, max_bytes: int) -> int:
        """Check the crc of up to about ``max_bytes`` of sealed segments not yet verified since start
        (when the log opens they are trusted up to their last index entry); bad records become
        holes. Returns the bytes checked: 0 once everything is verified."""
        checked = 0
        for segment in self.segments[:-1]:
            while segment.verified < segment.size and checked < max_bytes:
                checked += self._verify_chunk(segment)
            if checked >= max_bytes:
                break
        return checked

    def _verify_chunk(self, segment: Segment) -> int:
        position, expected = segment.verified, segment.verified_offset
        records, end, problem = self._read_valid(segment, position, expected, segment.size)
        if records:
            expected = records[-1].offset + 1
        if problem is not None:
            resumed_at, resumed_offset = self._skip_bad(segment, end, expected)
            self._report(
                f"{problem} at byte {end} of sealed segment {segment.path.name}: offsets "
                f"{expected}..{resumed_offset - 1} unreadable"
            )
            self._add_hole(Hole(expected, resumed_offset, end, resumed_at))
            if resumed_at < segment.size:
                segment.add_index(resumed_offset, resumed_at)
            end, expected = resumed_at, resumed_offset
        segment.verified, segment.verified_offset = end, expected
        return max(end - position, 1)

    def _skip_bad(self, segment: Segment, position: int, expected: int) -> tuple[int, int]:
        """(position, offset) where good records go on after a bad one at ``position``: the first
        valid record found by resynchronising, at the latest the next index entry, or the end."""
        i = bisect.bisect_right(segment.index_positions, position)
        indexed = (
            (segment.index_positions[i], segment.index_offsets[i])
            if i < len(segment.index_positions)
            else None
        )
        limit = segment.size if indexed is None else min(segment.size, indexed[0] + READ_CHUNK)
        found = self._resync(segment, position, expected, limit)
        return found or indexed or (segment.size, segment.next_offset)
