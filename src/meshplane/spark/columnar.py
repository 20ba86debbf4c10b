"""Raw log records straight into Arrow columns, in one compiled pass: the hot loop of a Spark read.

The record layout is ``core.streamlog``'s (``len | crc32 | offset | time_ms | msgpack StoredEvent``).
A numba-compiled scan checks every record's crc and sequence, walks its msgpack fields, checks that
their text is UTF-8 (as msgspec would) and copies key, value, event type and id into plain Arrow
columns (offsets + bytes) while the record is in cache; Arrow takes the arrays without a copy. No
Python object is made per row. It takes what services publish: data as text, bytes, null or a JSON
value (maps, lists, numbers, written as JSON as it is scanned: :mod:`meshplane.spark.transcode`),
keys as text or any bytes, without metadata. A chunk holding anything else (metadata, bad text,
msgpack extension types) returns None and goes through the general decoder, which names any problem.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from meshplane.core.streamlog import HEADER_SIZE
from meshplane.spark.bytescan import CRC_TABLE, _be, _copy, _crc32, _high_bits, _text, _utf8
from meshplane.spark.decode import LOG_APPEND_TIME, empty_headers
from meshplane.spark.transcode import (
    DEPTH,
    KEY_FIELDS,
    MAX_KEYS,
    NO_FLOATS,
    OUT_FULL_VALUE,
    STACK_FIELDS,
    float_texts,
    transcode,
)

OK, CORRUPT, COMPLEX, OUT_FULL, FLOATS = 0, 1, 2, 3, 4


@numba.njit(inline="always")
def _put(data, starts, fill, column, row, buf, start, length):  # type: ignore[no-untyped-def]
    """Append ``buf[start:start + length]`` as row ``row`` of column ``column`` (Arrow's plain layout:
    column c's bytes from ``c * len(buf)`` in ``data``, its int32 offsets in ``starts[c]``)."""
    starts[column, row] = fill[column]
    _copy(data, column * buf.shape[0] + fill[column], buf, start, length)
    fill[column] += length


@numba.njit(cache=True, nogil=True)
def scan(buf, first, end, table, room, float_text, float_bounds, binary_keys):  # type: ignore[no-untyped-def]
    """Records ``first``..``end - 1`` of ``buf`` into columns: (status, rows, offsets, stamps, key_valid,
    value_valid, starts, data, fill, values, floats): key, event_type and id copied out while each record
    is in cache, column c's bytes at ``data[c * len(buf):][:fill[c]]``, its Arrow offsets in
    ``starts[c, :rows + 1]``; the value's bytes (text and bytes as they are, anything else as JSON, by
    :func:`~meshplane.spark.transcode.transcode`) at ``values[:fill[1]]`` (``room`` bytes).

    status OK: ``rows`` records read (a record cut by the end of ``buf`` ends the scan); CORRUPT: record
    ``rows`` has a bad crc or sequence; COMPLEX: record ``rows`` needs the general decoder; OUT_FULL: the
    values need more room; FLOATS: the values hold ``len(floats)`` floats and no ``float_bounds`` were
    given: scan again with their texts (:func:`~meshplane.spark.transcode.float_texts`).

    Keys that are not UTF-8 are stored as msgpack bin (core.keys): with ``binary_keys`` (Kafka's binary
    key column) their bytes are copied as they are; a string key column (``columns=legacy``) leaves them
    to the general decoder, which writes U+FFFD for what is not UTF-8.
    """
    size = buf.shape[0]
    most = max(0, min(end - first, size // HEADER_SIZE))
    offsets = np.empty(most, np.int64)
    stamps = np.empty(most, np.int64)
    key_valid = np.empty(most, np.bool_)
    value_valid = np.empty(most, np.bool_)
    # Not zeroed: only what the rows read write is used (the fields fill at most len(buf) per column).
    starts = np.empty((4, most + 1), np.int32)
    data = np.empty(4 * size, np.uint8)
    values = np.empty(room, np.uint8)
    fill = np.zeros(4, np.int64)
    floats = np.empty(size // 5 + 1 if float_bounds.shape[0] == 0 else 0, np.float64)  # 5+ bytes each
    state = np.zeros(4, np.int64)  # transcode's: values' fill, next float text, floats collected, maps
    stack = np.empty((DEPTH, STACK_FIELDS), np.int64)
    keys = np.full((MAX_KEYS, KEY_FIELDS), -1, np.int64)  # kept from one record to the next
    status = OK
    pos = np.int64(0)
    row = 0
    while row < most and pos + HEADER_SIZE <= size:
        length = np.int64(_be(buf, pos, 4))
        stop = pos + 8 + length
        if stop > size:
            break
        if (
            length < HEADER_SIZE - 8
            or _be(buf, pos + 4, 4) != _crc32(buf, pos + 8, stop, table)
            or _be(buf, pos + 8, 8) != first + row
        ):
            status = CORRUPT
            break
        offsets[row] = first + row
        stamps[row] = np.int64(_be(buf, pos + 16, 8)) * 1000
        p = pos + HEADER_SIZE
        # StoredEvent: a fixarray of id, event_type, data[, key[, metadata[, mark]]]. Anything unexpected goes
        # to the general decoder, which names the problem.
        fields = buf[p] - 0x90 if p < stop else 0
        if fields < 3 or fields > 6:
            status = COMPLEX
            break
        id_start, id_len = _text(buf, p + 1, stop, False)
        if id_start < 0:
            status = COMPLEX
            break
        type_start, type_len = _text(buf, id_start + id_len, stop, False)
        if type_start < 0:
            status = COMPLEX
            break
        value_at = type_start + type_len
        value_start, value_len = _text(buf, value_at, stop, True)
        value_valid[row] = True
        starts[1, row] = state[0]
        if value_start >= 0:
            if room - state[0] < value_len:
                status = OUT_FULL
                break
            _copy(values, state[0], buf, value_start, value_len)
            state[0] += value_len
            p = value_start + value_len
        elif value_at < stop and buf[value_at] == 0xC0:  # null stays null (Kafka's tombstone)
            value_valid[row] = False
            value_start, value_len = value_at, 0
            p = value_at + 1
        else:  # a map, a list, a number: JSON
            p = transcode(buf, value_at, stop, values, state, float_text, float_bounds, floats, stack, keys)
            if p < 0:
                status = OUT_FULL if p == OUT_FULL_VALUE else COMPLEX
                break
            value_start, value_len = value_at, 0
        key_start, key_len, key_is_text = np.int64(-1), np.int64(0), True
        if fields >= 4 and p >= stop:
            status = COMPLEX
            break
        if fields >= 4:
            if buf[p] == 0xC0:
                p += 1
            else:
                key_is_text = buf[p] < 0xC4 or buf[p] > 0xC6  # not bin
                key_start, key_len = _text(buf, p, stop, binary_keys)
                if key_start < 0:
                    status = COMPLEX
                    break
                p = key_start + key_len
        if fields >= 5:  # metadata: only null or {}
            if p >= stop or (buf[p] != 0xC0 and buf[p] != 0x80):
                status = COMPLEX
                break
            p += 1
        if fields == 6:  # an idempotent publish's mark (core.idempotency): text, skipped
            mark_start, mark_len = _text(buf, p, stop, False)
            if mark_start < 0:
                status = COMPLEX
                break
            p = mark_start + mark_len
        if p != stop:  # the event must fill its record exactly, as msgspec insists
            status = COMPLEX
            break
        value_header = buf[value_at]
        value_is_text = 0xA0 <= value_header <= 0xBF or 0xD9 <= value_header <= 0xDB  # str, not bin
        key_at = max(key_start, 0)
        value_text_len = value_len if value_is_text else 0
        key_text_len = key_len if key_is_text else 0
        if (
            _high_bits(buf, id_start, id_len)
            | _high_bits(buf, type_start, type_len)
            | _high_bits(buf, key_at, key_text_len)
            | _high_bits(buf, value_start, value_text_len)
        ) and not (
            _utf8(buf, id_start, id_len)
            and _utf8(buf, type_start, type_len)
            and _utf8(buf, key_at, key_text_len)
            and _utf8(buf, value_start, value_text_len)
        ):
            status = COMPLEX  # the general decoder names the bad text
            break
        key_valid[row] = key_start >= 0
        _put(data, starts, fill, 0, row, buf, max(key_start, 0), key_len)
        _put(data, starts, fill, 2, row, buf, type_start, type_len)
        _put(data, starts, fill, 3, row, buf, id_start, id_len)
        row += 1
        pos = stop
    fill[1] = state[0]
    for column in range(4):
        starts[column, row] = fill[column]
    if status == OK and state[2] > 0:
        status = FLOATS
    collected = floats[: state[2]]
    return status, row, offsets, stamps, key_valid, value_valid, starts, data, fill, values, collected


def _column(
    kind: pa.DataType,
    rows: int,
    offsets: npt.NDArray[np.int32],
    data: npt.NDArray[np.uint8],
    valid: npt.NDArray[np.bool_] | None,
) -> pa.Array:
    """A plain Arrow column over the scan's arrays, without a copy."""
    nulls = None
    null_count = 0
    if valid is not None:
        null_count = rows - int(np.count_nonzero(valid[:rows]))
        if null_count:
            nulls = pa.py_buffer(np.packbits(valid[:rows], bitorder="little"))
    return pa.Array.from_buffers(kind, rows, [nulls, pa.py_buffer(offsets), pa.py_buffer(data)], null_count)


def scan_to_arrow(
    data: bytes | memoryview, first: int, end: int, topic: str, partition: int, schema: pa.Schema
) -> tuple[pa.RecordBatch, int] | None:
    """An Arrow batch of the records ``first``..``end - 1`` in ``data``, and how many there were.

    None when a record needs the general decoder (text/bytes data without metadata is the fast case).
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    binary_keys = schema.field("key").type == pa.binary()
    room = 2 * len(buf) + 4096  # text as it is; JSON: up to ~6 bytes a byte (`false,` for 0xC2)
    float_text, float_bounds = NO_FLOATS
    while True:
        status, rows, offsets, stamps, key_valid, value_valid, starts, fields, fill, values, floats = scan(
            buf, first, end, CRC_TABLE, room, float_text, float_bounds, binary_keys
        )
        if status == OUT_FULL:
            room = max(2 * room, 6 * len(buf) + 4096)
        elif status == FLOATS:
            float_text, float_bounds = float_texts(floats)
        else:
            break
    if status == CORRUPT:
        raise RuntimeError(f"corrupt record at offset {first + rows} (crc or sequence mismatch)")
    if status == COMPLEX:
        return None
    size = len(buf)
    key, _, event_type, event_id = (
        (starts[c, : rows + 1], fields[c * size : c * size + fill[c]]) for c in range(4)
    )
    value = starts[1, : rows + 1], values[: fill[1]]
    name = topic.encode()
    topic_offsets = np.arange(rows + 1, dtype=np.int32) * len(name)
    columns = {
        "key": _column(schema.field("key").type, rows, *key, key_valid),
        "value": _column(pa.binary(), rows, *value, value_valid),
        "topic": pa.Array.from_buffers(
            pa.string(), rows, [None, pa.py_buffer(topic_offsets), pa.py_buffer(name * rows)]
        ),
        "partition": pa.array(np.full(rows, partition, np.int32)),
        "offset": pa.array(offsets[:rows]),
        "timestamp": pa.array(stamps[:rows], pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array(np.full(rows, LOG_APPEND_TIME, np.int32)),
        "event_type": _column(pa.string(), rows, *event_type, None),
        "id": _column(pa.string(), rows, *event_id, None),
        "metadata": pa.MapArray.from_arrays(
            pa.array(np.zeros(rows + 1, np.int32)), pa.array([], pa.string()), pa.array([], pa.string())
        ),
    }
    if "headers" in schema.names:
        columns["headers"] = empty_headers(rows)
    return pa.RecordBatch.from_arrays([columns[n] for n in schema.names], schema=schema), rows
