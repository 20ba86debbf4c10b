"""Raw log records straight into Arrow columns, in one compiled pass: the hot loop of a Spark read.

The record layout is ``core.streamlog``'s (``len | crc32 | offset | time_ms | msgpack StoredEvent``).
A numba-compiled scan checks every record's crc and sequence, walks its msgpack fields and writes
Arrow views of key, value, event type and id into the fetched bytes; one C++ cast per column then
copies them into plain Arrow columns. No Python object is made per row. It takes the common shape:
data as text or bytes, no metadata. A chunk holding anything else (JSON values, metadata) returns
None and goes through the general decoder.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from meshplane.core.streamlog import HEADER_SIZE

OK, CORRUPT, COMPLEX = 0, 1, 2


def _crc_table() -> npt.NDArray[np.uint32]:
    """zlib's CRC-32 (reflected polynomial 0xEDB88320), slicing-by-8 tables."""
    table = np.zeros((8, 256), dtype=np.uint32)
    for byte in range(256):
        c = byte
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table[0, byte] = c
    for byte in range(256):
        c = int(table[0, byte])
        for k in range(1, 8):
            c = int(table[0, c & 0xFF]) ^ (c >> 8)
            table[k, byte] = c
    return table


CRC_TABLE = _crc_table()


@numba.njit(cache=True, nogil=True)
def _crc32(buf, start, stop, t):  # type: ignore[no-untyped-def]
    c = np.uint32(0xFFFFFFFF)
    i = start
    while i + 8 <= stop:
        lo = c ^ (
            np.uint32(buf[i])
            | (np.uint32(buf[i + 1]) << 8)
            | (np.uint32(buf[i + 2]) << 16)
            | (np.uint32(buf[i + 3]) << 24)
        )
        c = (
            t[7, lo & 0xFF]
            ^ t[6, (lo >> 8) & 0xFF]
            ^ t[5, (lo >> 16) & 0xFF]
            ^ t[4, lo >> 24]
            ^ t[3, buf[i + 4]]
            ^ t[2, buf[i + 5]]
            ^ t[1, buf[i + 6]]
            ^ t[0, buf[i + 7]]
        )
        i += 8
    while i < stop:
        c = t[0, (c ^ buf[i]) & 0xFF] ^ (c >> 8)
        i += 1
    return c ^ np.uint32(0xFFFFFFFF)


@numba.njit(cache=True, nogil=True)
def _be(buf, pos, size):  # type: ignore[no-untyped-def]
    """An unsigned big-endian integer of ``size`` bytes."""
    value = np.uint64(0)
    for i in range(size):
        value = (value << np.uint64(8)) | np.uint64(buf[pos + i])
    return value


@numba.njit(cache=True, nogil=True)
def _text(buf, pos, stop, allow_bin):  # type: ignore[no-untyped-def]
    """A msgpack str (or bin, if allowed) at ``pos`` in the record ending at ``stop``: (start, length).

    start is -1 when it is not one, or when it would run past the record: no read leaves a record.
    """
    b = buf[pos] if pos < stop else 0
    if 0xA0 <= b <= 0xBF:
        header = 1
    elif b == 0xD9 or (allow_bin and b == 0xC4):
        header = 2
    elif b == 0xDA or (allow_bin and b == 0xC5):
        header = 3
    elif b == 0xDB or (allow_bin and b == 0xC6):
        header = 5
    else:
        return np.int64(-1), np.int64(0)
    if pos + header > stop:
        return np.int64(-1), np.int64(0)
    length = np.int64(b & 0x1F) if header == 1 else np.int64(_be(buf, pos + 1, header - 1))
    if pos + header + length > stop:
        return np.int64(-1), np.int64(0)
    return pos + header, length


@numba.njit(cache=True, nogil=True)
def _view(buf, start, length, row, column, views, ints):  # type: ignore[no-untyped-def]
    """An Arrow view of ``buf[start:start + length]``: up to 12 bytes inline, else prefix + offset."""
    ints[column, row, 0] = length
    for i in range(length if length <= 12 else 4):
        views[column, row, 4 + i] = buf[start + i]
    if length > 12:
        ints[column, row, 3] = start  # in data buffer 0 (zeroed): the fetched bytes themselves


@numba.njit(cache=True, nogil=True)
def scan(buf, first, end, table):  # type: ignore[no-untyped-def]
    """Records ``first``..``end - 1`` of ``buf`` into columns: (status, rows, offsets, stamps, key_valid,
    views), views being Arrow binary views into ``buf`` of key, value, event_type and id.

    status OK: ``rows`` records read (a record cut by the end of ``buf`` ends the scan); CORRUPT: record
    ``rows`` has a bad crc or sequence; COMPLEX: record ``rows`` needs the general decoder.
    """
    size = buf.shape[0]
    most = max(0, min(end - first, size // HEADER_SIZE))
    offsets = np.empty(most, np.int64)
    stamps = np.empty(most, np.int64)
    key_valid = np.zeros(most, np.bool_)
    views = np.zeros((4, most, 16), np.uint8)
    ints = views.view(np.int32)
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
        # StoredEvent: a fixarray of id, event_type, data[, key[, metadata]]. Anything unexpected goes
        # to the general decoder, which names the problem.
        fields = buf[p] - 0x90 if p < stop else 0
        if fields < 3 or fields > 5:
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
        value_start, value_len = _text(buf, type_start + type_len, stop, True)
        if value_start < 0:  # null or a JSON value
            status = COMPLEX
            break
        p = value_start + value_len
        key_start, key_len = np.int64(-1), np.int64(0)
        if fields >= 4 and p >= stop:
            status = COMPLEX
            break
        if fields >= 4:
            if buf[p] == 0xC0:
                p += 1
            else:
                key_start, key_len = _text(buf, p, stop, False)
                if key_start < 0:
                    status = COMPLEX
                    break
                p = key_start + key_len
        if fields == 5 and (p >= stop or (buf[p] != 0xC0 and buf[p] != 0x80)):  # metadata: only null or {}
            status = COMPLEX
            break
        if p + (fields == 5) != stop:  # the event must fill its record exactly, as msgspec insists
            status = COMPLEX
            break
        if key_start >= 0:
            key_valid[row] = True
            _view(buf, key_start, key_len, row, 0, views, ints)
        _view(buf, value_start, value_len, row, 1, views, ints)
        _view(buf, type_start, type_len, row, 2, views, ints)
        _view(buf, id_start, id_len, row, 3, views, ints)
        row += 1
        pos = stop
    return status, row, offsets, stamps, key_valid, views


def _column(
    kind: pa.DataType,
    rows: int,
    views: npt.NDArray[np.uint8],
    data: pa.Buffer,
    valid: npt.NDArray[np.bool_] | None,
) -> pa.Array:
    """Views into the fetched bytes, then one C++ cast copies them into a plain Arrow column."""
    nulls = None
    null_count = 0
    if valid is not None:
        null_count = rows - int(np.count_nonzero(valid[:rows]))
        if null_count:
            nulls = pa.py_buffer(np.packbits(valid[:rows], bitorder="little"))
    view_kind = pa.binary_view() if kind == pa.binary() else pa.string_view()
    viewed = pa.Array.from_buffers(view_kind, rows, [nulls, pa.py_buffer(views[:rows]), data], null_count)
    return viewed.cast(kind)


def scan_to_arrow(
    data: bytes | memoryview, first: int, end: int, topic: str, partition: int, schema: pa.Schema
) -> tuple[pa.RecordBatch, int] | None:
    """An Arrow batch of the records ``first``..``end - 1`` in ``data``, and how many there were.

    None when a record needs the general decoder (text/bytes data without metadata is the fast case).
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    status, rows, offsets, stamps, key_valid, views = scan(buf, first, end, CRC_TABLE)
    if status == CORRUPT:
        raise RuntimeError(f"corrupt record at offset {first + rows} (crc or sequence mismatch)")
    if status == COMPLEX:
        return None
    fetched = pa.py_buffer(data)
    name = topic.encode()
    topic_offsets = np.arange(rows + 1, dtype=np.int32) * len(name)
    arrays = [
        _column(pa.string(), rows, views[0], fetched, key_valid),
        _column(pa.binary(), rows, views[1], fetched, None),
        pa.Array.from_buffers(
            pa.string(), rows, [None, pa.py_buffer(topic_offsets), pa.py_buffer(name * rows)]
        ),
        pa.array(np.full(rows, partition, np.int32)),
        pa.array(offsets[:rows]),
        pa.array(stamps[:rows], pa.timestamp("us", tz="UTC")),
        _column(pa.string(), rows, views[2], fetched, None),
        _column(pa.string(), rows, views[3], fetched, None),
        pa.MapArray.from_arrays(
            pa.array(np.zeros(rows + 1, np.int32)), pa.array([], pa.string()), pa.array([], pa.string())
        ),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema), rows
