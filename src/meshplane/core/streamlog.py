"""The partition log's record format, retention decisions and key routing: pure code, no files.

A log is a sequence of segments; a segment is a concatenation of records::

    length  u32   bytes after the crc field (16 + len(payload))
    crc     u32   zlib.crc32 of those bytes
    offset  u64   the record's offset in its partition
    time    i64   publish time, milliseconds since the epoch
    payload bytes an encoded StoredEvent

A crash can leave a torn or garbled tail; :func:`scan_records` stops at the first record that is
incomplete, fails its crc or breaks the offset sequence, and reports where the valid bytes end so
that the adapter truncates there.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import msgspec

from meshplane.core.compiled import compiled
from meshplane.errors import OffsetOutOfRange

RECORD_HEADER = struct.Struct(">IIQq")
HEADER_SIZE = RECORD_HEADER.size  # 24
_AFTER_CRC = 16  # offset + time
MAX_RECORD_BYTES = 64 * 1024 * 1024


class StoredEvent(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one record holds. ``data`` is any JSON-compatible value or bytes; ``key`` is text, or bytes
    when it is not UTF-8 (Kafka's keys are any bytes: msgpack keeps the two apart, str and bin)."""

    id: str
    event_type: str
    data: Any = None
    key: Any = None  # str | bytes | None: msgspec's unions hold one of str and bytes, so checked on decode
    metadata: dict[str, str] | None = None


class MarkedEvent(StoredEvent, array_like=True, omit_defaults=True):
    """A stored event with a sixth field: the mark of an idempotent publish (:mod:`.idempotency`), on
    the last event it appends to a partition. Decoding as StoredEvent ignores it."""

    idempotency: str | None = None


_encoder = msgspec.msgpack.Encoder()
EVENT_DECODER = msgspec.msgpack.Decoder(StoredEvent)
MARKED_DECODER = msgspec.msgpack.Decoder(MarkedEvent)


def encode_event(event: StoredEvent) -> bytes:
    return _encoder.encode(event)


def decode_event(payload: bytes | memoryview) -> StoredEvent:
    """Raises msgspec.DecodeError (or ValidationError) on anything but a stored event."""
    try:
        event = EVENT_DECODER.decode(payload)
    except UnicodeDecodeError as exc:  # msgspec lets a string that is not UTF-8 through as this
        raise msgspec.DecodeError(f"a string that is not UTF-8: {exc}") from None
    _check_key(event.key)
    return event


def _check_key(key: object) -> None:
    """Raises msgspec.ValidationError unless ``key`` is what a stored event's key may be."""
    if key is not None and type(key) is not str and type(key) is not bytes:
        raise msgspec.ValidationError(f"an event key must be text or bytes, not {type(key).__name__}")


_native = compiled("meshplane.core._records")  # chosen once: it makes and reads the bytes this module does


def encode_record(offset: int, timestamp_ms: int, payload: bytes) -> bytes:
    if _native is not None:
        record: bytes | None = _native.encode(offset, timestamp_ms, payload)
        if record is not None:
            return record
    return python_encode_record(offset, timestamp_ms, payload)


def python_encode_record(offset: int, timestamp_ms: int, payload: bytes) -> bytes:
    """The reference encoder (``_records.c`` makes the same bytes, or leaves the case to this one)."""
    body = struct.pack(">Qq", offset, timestamp_ms) + payload
    return struct.pack(">II", len(body), zlib.crc32(body)) + body


class Record(NamedTuple):  # a tuple: cheapest to create on the hot read path
    offset: int
    timestamp_ms: int
    payload: bytes
    position: int  # where the record starts in its segment
    size: int  # header + payload


_LENGTH = struct.Struct(">I")
_OFFSET = struct.Struct(">Q")


def record_size(buffer: bytes | memoryview, position: int = 0) -> int:
    """The whole size (header and payload) of the record at ``position``, from its length field;
    0 when its length field is not all there."""
    if len(buffer) - position < _LENGTH.size:
        return 0
    return 8 + int(_LENGTH.unpack_from(buffer, position)[0])


def record_offset(buffer: bytes | memoryview, position: int = 0) -> int:
    """The offset field of the record at ``position``."""
    return int(_OFFSET.unpack_from(buffer, position + 8)[0])


@dataclass(frozen=True, slots=True)
class ScanResult:
    records: list[Record]
    valid_end: int  # position just after the last valid record
    problem: str | None  # why scanning stopped before the end of the buffer, if it did


def scan_records(
    buffer: bytes | memoryview,
    *,
    start_position: int = 0,
    expected_offset: int | None = None,
    max_records: int | None = None,
) -> ScanResult:
    """Decode consecutive records from ``buffer`` (which starts at ``start_position`` in its segment).

    Stops at the end of the buffer, after ``max_records``, or at the first record that is
    incomplete, corrupt or out of sequence (``problem`` says which).
    """
    data = buffer if isinstance(buffer, bytes) else bytes(buffer)
    view = memoryview(data)  # crc32 over slices of it copies nothing
    records: list[Record] = []
    # Bound once: this loop runs for every record a consumer reads.
    append, unpack, crc32, new_record = records.append, RECORD_HEADER.unpack_from, zlib.crc32, tuple.__new__
    pos = 0
    end = len(data)
    remaining = -1 if max_records is None else max_records
    problem: str | None = None
    scan = _native.scan if _native is not None else None
    while pos < end and remaining != 0:
        if scan is not None:  # as far as every record is sound; this loop takes the next one
            pos, expected_offset, remaining = scan(
                data, pos, expected_offset, remaining, start_position, Record, records
            )
            if pos >= end or remaining == 0:
                break
        if end - pos < HEADER_SIZE:
            problem = "truncated header"
            break
        length, crc, offset, timestamp_ms = unpack(data, pos)
        if length < _AFTER_CRC or length > MAX_RECORD_BYTES:
            problem = f"bad record length {length}"
            break
        stop = pos + 8 + length
        if stop > end:
            problem = "truncated record"
            break
        if crc32(view[pos + 8 : stop]) != crc:
            problem = "crc mismatch"
            break
        if expected_offset is not None and offset != expected_offset:
            problem = f"offset {offset} where {expected_offset} was expected"
            break
        append(
            new_record(
                Record,
                (offset, timestamp_ms, data[pos + HEADER_SIZE : stop], start_position + pos, stop - pos),
            )
        )
        expected_offset = offset + 1
        pos = stop
        remaining -= 1
    return ScanResult(records, start_position + pos, problem)


def resync(
    buffer: bytes | memoryview,
    *,
    start_position: int = 0,
    min_offset: int,
    max_offset: int | None = None,
) -> int | None:
    """Where the next valid record starts after a corrupt one: the first position in ``buffer`` that
    holds a whole record with a good crc and an offset in ``min_offset..max_offset``; None if none does.

    Linear in the buffer: the crc is computed only where the length and offset already fit.
    """
    data = buffer if isinstance(buffer, bytes) else bytes(buffer)
    view = memoryview(data)
    unpack, end = RECORD_HEADER.unpack_from, len(data)
    for pos in range(0, end - HEADER_SIZE + 1):
        length, crc, offset, _ = unpack(data, pos)
        if not _AFTER_CRC <= length <= MAX_RECORD_BYTES or pos + 8 + length > end:
            continue
        if offset < min_offset or (max_offset is not None and offset > max_offset):
            continue
        if zlib.crc32(view[pos + 8 : pos + 8 + length]) == crc:
            return start_position + pos
    return None


@dataclass(frozen=True, slots=True)
class Hole:
    """Offsets ``first..end-1`` whose records are unreadable (bytes ``position..end_position`` of their
    segment); the records around them are intact."""

    first: int
    end: int
    position: int
    end_position: int


@dataclass(frozen=True, slots=True)
class SegmentAudit:
    """What a whole segment holds: valid records, and each bad stretch with where records resume."""

    records: int
    first_offset: int | None
    next_offset: int  # one past the last valid record (the base offset if none)
    valid_bytes: int
    problems: list[tuple[int, str, int | None]]  # (position, problem, position records resume at or None)


def audit_segment(data: bytes, base_offset: int, max_offset: int | None = None) -> SegmentAudit:
    """Check every record of a segment's bytes, resynchronising after each bad one (read-only)."""
    position, expected, records, valid = 0, base_offset, 0, 0
    first: int | None = None
    problems: list[tuple[int, str, int | None]] = []
    while position < len(data):
        result = scan_records(memoryview(data)[position:], start_position=position, expected_offset=expected)
        if result.records:
            first = result.records[0].offset if first is None else first
            expected = result.records[-1].offset + 1
            records += len(result.records)
            valid += result.valid_end - position
        position = result.valid_end
        if result.problem is None:
            break
        resumed = resync(
            memoryview(data)[position + 1 :],
            start_position=position + 1,
            min_offset=expected,
            max_offset=max_offset,
        )
        problems.append((position, result.problem, resumed))
        if resumed is None:
            break
        position = resumed
        expected = RECORD_HEADER.unpack_from(data, resumed)[2]
    return SegmentAudit(records, first, expected, valid, problems)


# --- retention -------------------------------------------------------------------------------------


RetentionKind = Literal["infinite", "time", "size", "messages", "combined"]


class RetentionPolicy(msgspec.Struct, frozen=True, omit_defaults=True):
    """When whole segments may be deleted. ``None`` limits do not apply; the smallest limit wins."""

    retention_secs: float | None = None
    max_bytes: int | None = None
    max_messages: int | None = None

    @property
    def kind(self) -> RetentionKind:
        limits = [x is not None for x in (self.retention_secs, self.max_bytes, self.max_messages)]
        if sum(limits) == 0:
            return "infinite"
        if sum(limits) > 1:
            return "combined"
        return "time" if limits[0] else "size" if limits[1] else "messages"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind.capitalize()}
        for name in ("retention_secs", "max_bytes", "max_messages"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, raw: object) -> RetentionPolicy:
        """Parse Synap's ``{"type": "Time"|"Size"|"Messages"|"Combined"|"Infinite", ...}`` shape."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError("retention_policy must be an object")
        kind = str(raw.get("type", "combined")).lower()
        needed = {
            "infinite": (),
            "time": ("retention_secs",),
            "size": ("max_bytes",),
            "messages": ("max_messages",),
            "combined": (),
        }
        if kind not in needed:
            raise ValueError(
                f"unknown retention type {raw.get('type')!r} (Time, Size, Messages, Combined, Infinite)"
            )
        for name in needed[kind]:
            if name not in raw:
                raise ValueError(f"retention type {raw['type']!r} needs {name}")
        values: dict[str, Any] = {}
        for name in ("retention_secs", "max_bytes", "max_messages"):
            value = raw.get(name)
            if value is None or kind == "infinite" or (kind != "combined" and name not in needed[kind]):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"retention {name} must be a positive number, not {value!r}")
            values[name] = value if name == "retention_secs" else int(value)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base_offset: int
    next_offset: int  # one past the last record
    size_bytes: int
    last_timestamp_ms: int | None

    @property
    def count(self) -> int:
        return self.next_offset - self.base_offset


def segments_to_delete(segments: Sequence[SegmentInfo], policy: RetentionPolicy, now_ms: int) -> int:
    """How many of the oldest segments retention removes. The active (last) segment is never removed."""
    total_bytes = sum(s.size_bytes for s in segments)
    total_messages = sum(s.count for s in segments)
    deleted = 0
    for segment in segments[:-1]:
        expired = (
            policy.retention_secs is not None
            and segment.last_timestamp_ms is not None
            and now_ms - segment.last_timestamp_ms > policy.retention_secs * 1000
        )
        too_big = policy.max_bytes is not None and total_bytes - segment.size_bytes >= policy.max_bytes
        too_many = policy.max_messages is not None and total_messages - segment.count >= policy.max_messages
        if not (expired or too_big or too_many):
            break
        total_bytes -= segment.size_bytes
        total_messages -= segment.count
        deleted += 1
    return deleted


def logical_start_offset(segment_start: int, next_offset: int, policy: RetentionPolicy) -> int:
    """The oldest readable offset: count retention is exact, not rounded to whole segments."""
    if policy.max_messages is None:
        return segment_start
    return max(segment_start, next_offset - policy.max_messages)


# --- offsets and routing ---------------------------------------------------------------------------


def resolve_start_offset(from_offset: int | None, oldest: int, next_offset: int) -> int:
    """Where a reader starts: None = latest (only new events), n >= 0 = that offset, -n = the last n.

    An offset below ``oldest`` raises OffsetOutOfRange; one past ``next_offset`` too.
    """
    newest = next_offset - 1 if next_offset > oldest else None
    if from_offset is None:
        return next_offset
    if from_offset < 0:
        return max(oldest, next_offset + from_offset)
    if from_offset < oldest or from_offset > next_offset:
        raise OffsetOutOfRange(from_offset, oldest, newest)
    return from_offset


def partition_for_key(key: str | bytes, partitions: int) -> int:
    """Synap's routing: ``crc32(key) % partitions``, so keyed events land where Synap users expect."""
    raw = key.encode() if isinstance(key, str) else key
    return zlib.crc32(raw) % partitions
