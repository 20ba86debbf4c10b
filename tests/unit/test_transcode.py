"""Events whose data is a JSON value (what a Python service posting dicts stores) are read by the compiled
scan, and its ``value`` column is byte for byte the general decoder's (``msgspec.json.encode`` of what
``msgspec.msgpack.decode`` makes of the stored data), for every msgpack encoding of that data."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.streamlog import StoredEvent, encode_event, encode_record
from meshplane.spark.bytescan import CRC_TABLE
from meshplane.spark.columnar import scan, scan_to_arrow
from meshplane.spark.decode import ARROW_SCHEMA, arrow_schema, decode_columns, to_arrow
from meshplane.spark.transcode import DEPTH, NO_FLOATS, float_texts

texts = st.text(max_size=40)  # any code point: escapes, 2-4 byte UTF-8, U+2028
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # past 2**53, both ends of msgpack's range
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(width=32),
    st.builds(lambda m, k: m / 10**k, st.integers(-(10**16), 10**16), st.integers(0, 20)),  # 12.5, 0.1
    texts,
    st.binary(max_size=40),
)
json_data = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(texts, inner, max_size=6)),
    max_leaves=25,
)


def _uint(value: int, widths: list[tuple[int, str]], draw: st.DrawFn) -> bytes:
    fits = [
        (header, fmt)
        for header, fmt in widths
        if value <= (1 << (8 * struct.calcsize(fmt) - fmt.islower())) - 1
    ]
    header, fmt = draw(st.sampled_from(fits))
    return bytes([header]) + struct.pack(fmt, value)


@st.composite
def msgpack_of(draw: st.DrawFn, value: object) -> bytes:
    """``value`` in any of msgpack's encodings of it (wider headers than needed, float32 where exact):
    a producer other than msgspec (msgpack-python, Go, Java) chooses its own."""
    if value is None:
        return b"\xc0"
    if isinstance(value, bool):
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        if value < 0:
            options = [(0xD0, ">b"), (0xD1, ">h"), (0xD2, ">i"), (0xD3, ">q")]
            fits = [(h, f) for h, f in options if value >= -(1 << (8 * struct.calcsize(f) - 1))]
            if value >= -32:
                return draw(
                    st.sampled_from(
                        [bytes([value & 0xFF]), *(bytes([h]) + struct.pack(f, value) for h, f in fits)]
                    )
                )
            header, fmt = draw(st.sampled_from(fits))
            return bytes([header]) + struct.pack(fmt, value)
        wide = _uint(value, [(0xCC, ">B"), (0xCD, ">H"), (0xCE, ">I"), (0xCF, ">Q"), (0xD3, ">q")], draw)
        return bytes([value]) if value < 128 and draw(st.booleans()) else wide
    if isinstance(value, float):
        exact = not math.isfinite(value) or (
            abs(value) < 3e38 and struct.unpack(">f", struct.pack(">f", value))[0] == value
        )
        if exact and draw(st.booleans()):
            return b"\xca" + struct.pack(">f", value)
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str | bytes):
        raw = value.encode() if isinstance(value, str) else value
        if isinstance(value, str):
            headers = [(0xD9, ">B"), (0xDA, ">H"), (0xDB, ">I")]
            if len(raw) < 32 and draw(st.booleans()):
                return bytes([0xA0 | len(raw)]) + raw
        else:
            headers = [(0xC4, ">B"), (0xC5, ">H"), (0xC6, ">I")]
        return _uint(len(raw), headers, draw) + raw
    assert isinstance(value, dict | list)
    small, widths = (
        (0x80, [(0xDE, ">H"), (0xDF, ">I")])
        if isinstance(value, dict)
        else (0x90, [(0xDC, ">H"), (0xDD, ">I")])
    )
    count = len(value)
    head = bytes([small | count]) if count < 16 and draw(st.booleans()) else _uint(count, widths, draw)
    items = [part for pair in value.items() for part in pair] if isinstance(value, dict) else value
    parts = [head, *(draw(msgpack_of(item)) for item in items)]
    return b"".join(parts)


def stored(data: bytes, key: str | None = "k") -> bytes:
    """A StoredEvent's msgpack with ``data`` spliced in as it is."""
    return encode_event(StoredEvent(id="i", event_type="t", data=None, key=key)).replace(b"\xc0", data, 1)


def records(payloads: list[bytes], first: int = 0) -> bytes:
    return b"".join(encode_record(first + i, 1_700_000_000_000 + i, p) for i, p in enumerate(payloads))


def both(
    data: bytes, count: int, schema: pa.Schema = ARROW_SCHEMA
) -> tuple[pa.RecordBatch | None, pa.RecordBatch]:
    fast = scan_to_arrow(data, 0, count, "orders", 3, schema)
    return fast[0] if fast else None, to_arrow(decode_columns(data, 0, count), "orders", 3, schema)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(json_data, min_size=1, max_size=8),
    st.sampled_from([arrow_schema(True, True), arrow_schema(False)]),
)
def test_json_data_is_scanned_exactly_as_the_general_decoder_reads_it(
    values: list[object], schema: pa.Schema
) -> None:
    data = records([encode_event(StoredEvent(id="i", event_type="t", data=v, key="k")) for v in values])
    fast, general = both(data, len(values), schema)
    assert fast is not None, "a JSON value went to the general decoder"
    assert fast.equals(general)


@settings(max_examples=300, deadline=None)
@given(st.lists(json_data.flatmap(msgpack_of), min_size=1, max_size=8))
def test_every_msgpack_encoding_of_the_data_reads_as_the_general_decoder_reads_it(datas: list[bytes]) -> None:
    data = records([stored(d) for d in datas])
    fast, general = both(data, len(datas))
    assert fast is not None
    assert fast.equals(general), (fast.column("value"), general.column("value"))


# Keys as services repeat them from event to event, alike in prefix or length, needing escapes,
# non-ASCII, longer than a word; "u" twice in one map is a duplicate.
REPEATED_KEYS = ["u", "us", "user", "usex", "é", "日本", 'q"', "\x01", "a" * 8, "a" * 9, "a" * 8 + "b", ""]


@st.composite
def maps_with_repeated_keys(draw: st.DrawFn, depth: int = 0) -> tuple[bytes, bool]:
    """A msgpack map (keys in fixstr or str8), maybe nested, or a list of such maps; and whether some
    map holds a key twice."""
    if depth == 0 and draw(st.booleans()):
        items = draw(st.lists(maps_with_repeated_keys(1), max_size=3))
        return bytes([0x90 | len(items)]) + b"".join(m for m, _ in items), any(t for _, t in items)
    keys = draw(st.lists(st.sampled_from(REPEATED_KEYS), max_size=5))
    twice = len(set(keys)) < len(keys)
    parts = [bytes([0x80 | len(keys)])]
    for key in keys:
        raw = key.encode()
        parts.append(draw(st.sampled_from([bytes([0xA0 | len(raw)]), bytes([0xD9, len(raw)])])) + raw)
        if depth < 2 and draw(st.booleans()):
            value, nested_twice = draw(maps_with_repeated_keys(depth + 1))
            twice |= nested_twice
        else:
            value = draw(msgpack_of(draw(st.one_of(st.none(), st.integers(-5, 300), texts))))
        parts.append(value)
    return b"".join(parts), twice


@settings(max_examples=100, deadline=None)
@given(st.lists(maps_with_repeated_keys(), min_size=1, max_size=6))
def test_keys_repeated_from_event_to_event_read_as_the_general_decoder_reads_them(
    values: list[tuple[bytes, bool]],
) -> None:
    """The scan writes a key met again at the same place of a map as it wrote it before (without
    checking it again): the JSON stays the general decoder's, and a key twice in a map still steps aside."""
    data = records([stored(v) for v, _ in values])
    fast, general = both(data, len(values))
    if any(twice for _, twice in values):
        assert fast is None
        return
    assert fast is not None
    assert fast.equals(general), (fast.column("value"), general.column("value"))


def test_a_key_repeated_after_its_map_changed_shape_is_checked_again() -> None:
    """Event 2's map has event 1's first key, then a key event 1's nested map held at that slot; event
    3 repeats event 1's keys but its second key is the first one again (a duplicate)."""
    first = msgspec.msgpack.encode({"a": {"b": 1}, "c": 2})
    second = msgspec.msgpack.encode({"a": 1, "b": 2})  # "b" sat at slot 1 in event 1's nested map
    fast, general = both(records([stored(first), stored(second)]), 2)
    assert fast is not None
    assert fast.column("value").to_pylist() == [b'{"a":{"b":1},"c":2}', b'{"a":1,"b":2}']
    assert fast.equals(general)
    twice = b"\x82\xa1a\x01\xa1a\x02"  # {"a": 1, "a": 2}
    again = msgspec.msgpack.encode({"a": 1, "c": 2})
    assert scan_to_arrow(records([stored(again), stored(twice)]), 0, 2, "orders", 3, ARROW_SCHEMA) is None


def test_what_the_general_decoder_reads_otherwise_is_left_to_it() -> None:
    """A key twice in one map (the last value at the first key's place), a key that is not text, an
    extension type, bad UTF-8 in a nested string, nesting past DEPTH: the scan steps aside."""
    odd = [
        b"\x82\xa1a\x01\xa1a\x02",
        b"\x81\x01\x02",
        b"\x91\xd6\xff\x00\x00\x00\x01",  # a timestamp (msgspec: datetime)
        b"\x91\xa2\xc3\x28",
        b"\x91" * (DEPTH + 1) + b"\xc0",
    ]
    for data in odd:
        assert (
            scan_to_arrow(records([stored(b"\xa1x"), stored(data)]), 0, 2, "orders", 3, ARROW_SCHEMA) is None
        )
    _, general = both(records([stored(odd[0])]), 1)
    assert general.column("value").to_pylist() == [b'{"a":2}']  # what the scan must not guess at
    fast, general = both(records([stored(b"\x91" * DEPTH + b"\xc0")]), 1)
    assert fast is not None
    assert fast.equals(general)


def test_a_value_longer_as_json_than_the_whole_fetch_is_scanned_with_more_room() -> None:
    # false,false,... (6 bytes a byte), escaped controls, base64
    datas = [b"\xdc\x10\x00" + b"\xc2" * 4096, b"\x95" + b"\xa1\x00" * 5, b"\xc4\x03abc"]
    fast, general = both(records([stored(d) for d in datas]), len(datas))
    assert fast is not None
    assert fast.equals(general)


def test_floats_with_short_digits_are_written_in_one_pass() -> None:
    values = [12.5, -0.1, 0.0, -0.0, 1e-4, 999999999999999.9, 0.30000000000000004, 1e15, 3.14159]
    data = records([stored(msgspec.msgpack.encode(values))])
    fast, general = both(data, 1)
    assert fast is not None
    assert fast.equals(general)
    buf = np.frombuffer(data, np.uint8)
    floats = scan(buf, 0, 1, CRC_TABLE, 2 * len(buf) + 4096, *NO_FLOATS, True)[-1]
    # Left to msgspec: past 2**53 at its 16 digits, 17 digits, past the plain range checked here
    assert floats.tolist() == [999999999999999.9, 0.30000000000000004, 1e15]


def test_float_texts_are_msgspecs() -> None:
    values = [0.1, 1e16, 1e-5, -0.0, math.inf, math.nan, 5e-324, 123456789.125]
    text, bounds = float_texts(np.array(values))
    assert [bytes(text[a:b]) for a, b in bounds] == [msgspec.json.encode(v) for v in values]


_BOUNDS = """
import numpy as np
from meshplane.spark.transcode import DEPTH, KEY_FIELDS, MAX_KEYS, NO_FLOATS, STACK_FIELDS, transcode
key = b"k" * 40
event = b"\\x81\\xd9\\x28" + key + b"\\x01"  # {key: 1}, the key repeated in the third event
values = [event, b"\\xdc\\x00\\x4d" + b"\\x01" * 77, event]
for values, room in ((values, 244), ([b"\\x91" * 40 + b"\\x01"], 72)):
    buf = np.frombuffer(b"".join(values), np.uint8)
    out, state = np.zeros(room, np.uint8), np.zeros(4, np.int64)
    stack = np.empty((DEPTH, STACK_FIELDS), np.int64)
    keys = np.full((MAX_KEYS, KEY_FIELDS), -1, np.int64)
    pos = 0
    for value in values:
        transcode(buf, pos, pos + len(value), out, state, *NO_FLOATS, np.empty(1), stack, keys)
        pos += len(value)
"""


def test_no_write_leaves_out_when_it_is_nearly_full(tmp_path: Path) -> None:
    """numba does not check indexes: with them checked, a key copied from an earlier event that ends
    exactly at ``out``'s end (its ':' one past), and the brackets closing deep nesting after a value
    written with just 32 bytes to spare, must still stay inside ``out`` (else OUT_FULL_VALUE)."""
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _BOUNDS], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
