"""The compiled record scan gives exactly the Arrow batch the general decoder gives, or steps aside."""

from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.keys import stored_key
from meshplane.core.streamlog import MarkedEvent, StoredEvent, encode_event, encode_record
from meshplane.spark.bytescan import CRC_TABLE, HAS_CLMUL, _crc32_clmul, _crc32_tables, _utf8
from meshplane.spark.columnar import scan_to_arrow
from meshplane.spark.decode import ARROW_SCHEMA, arrow_schema, decode_columns, to_arrow

texts = st.text(max_size=300)  # up to 900 UTF-8 bytes: fixstr, str8 and str16 headers
# Keys as the log keeps them (core.keys): text, or msgpack bin when not UTF-8 (bin8 and bin16 headers;
# bin32: test_a_key_of_64_kib_that_is_not_utf8)
keys = st.one_of(st.none(), texts, st.binary(max_size=300).map(stored_key))
simple_events = st.one_of(
    *(
        st.builds(
            kind,
            id=texts,
            event_type=texts,
            data=st.one_of(texts, st.binary(max_size=70_000)),  # bin8, bin16 and bin32 headers
            key=keys,
            metadata=st.one_of(st.none(), st.just({})),
            **({"idempotency": texts} if kind is MarkedEvent else {}),  # an idempotent publish's mark
        )
        for kind in (StoredEvent, MarkedEvent)
    )
)
complex_events = st.builds(  # JSON data is the scan's too: tests/unit/test_transcode.py
    StoredEvent,
    id=texts,
    event_type=texts,
    data=texts,
    metadata=st.dictionaries(st.text(max_size=5), st.text(max_size=5), min_size=1, max_size=3),
)


def records(events: list[StoredEvent], first: int) -> bytes:
    return b"".join(
        encode_record(first + i, 1_700_000_000_000 + i, encode_event(e)) for i, e in enumerate(events)
    )


def general(data: bytes, first: int, end: int, schema: pa.Schema = ARROW_SCHEMA):  # type: ignore[no-untyped-def]
    return to_arrow(decode_columns(data, first, end), "orders", 3, schema)


SCHEMAS = [arrow_schema(kafka, headers) for kafka in (True, False) for headers in (False, True)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(simple_events, max_size=30),
    st.integers(0, 2**40),
    st.integers(0, 40),
    st.sampled_from(SCHEMAS),
)
def test_the_scan_matches_the_general_decoder(
    events: list[StoredEvent], first: int, limit: int, schema: pa.Schema
) -> None:
    data = records(events, first)
    end = first + limit
    result = scan_to_arrow(data, first, end, "orders", 3, schema)
    if schema.field("key").type == pa.string() and any(type(e.key) is bytes for e in events[:limit]):
        assert result is None  # keys that are not UTF-8 read with U+FFFD there: the general decoder's
        return
    assert result is not None
    batch, rows = result
    assert rows == min(limit, len(events))
    assert batch.equals(general(data, first, end, schema))


@settings(max_examples=50, deadline=None)
@given(st.lists(simple_events, min_size=1, max_size=10), st.data())
def test_a_record_cut_by_the_fetch_ends_the_batch(events: list[StoredEvent], draw: st.DataObject) -> None:
    data = records(events, 0)
    cut = draw.draw(st.integers(0, len(data) - 1))
    result = scan_to_arrow(data[:cut], 0, len(events), "orders", 3, ARROW_SCHEMA)
    assert result is not None
    batch, rows = result
    assert rows < len(events)
    assert batch.equals(general(data[:cut], 0, len(events)))


@settings(max_examples=50, deadline=None)
@given(st.lists(simple_events, max_size=5), complex_events, st.lists(simple_events, max_size=5))
def test_metadata_goes_to_the_general_decoder(
    before: list[StoredEvent], odd: StoredEvent, after: list[StoredEvent]
) -> None:
    events = [*before, odd, *after]
    assert scan_to_arrow(records(events, 0), 0, len(events), "orders", 3, ARROW_SCHEMA) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(simple_events, min_size=1, max_size=10), st.data())
def test_any_flipped_byte_or_a_wrong_sequence_is_an_error(
    events: list[StoredEvent], draw: st.DataObject
) -> None:
    encoded = [records([e], i) for i, e in enumerate(events)]
    victim = draw.draw(st.integers(0, len(events) - 1))
    at = sum(map(len, encoded[:victim])) + draw.draw(st.integers(4, len(encoded[victim]) - 1))
    data = bytearray(b"".join(encoded))  # a flipped length field would only look like a cut record
    data[at] ^= 1 + draw.draw(st.integers(0, 254))
    with pytest.raises(RuntimeError, match=f"corrupt record at offset {victim}"):
        scan_to_arrow(bytes(data), 0, len(events), "orders", 3, ARROW_SCHEMA)
    with pytest.raises(RuntimeError, match="corrupt record at offset 5"):
        scan_to_arrow(records(events, 6), 5, 20, "orders", 3, ARROW_SCHEMA)


@st.composite
def damaged_payload(draw: st.DrawFn) -> bytes:
    """A valid event cut short, with a byte changed, or both: msgpack that lies about its lengths."""
    payload = bytearray(encode_event(draw(simple_events)))
    if draw(st.booleans()):
        payload[draw(st.integers(0, len(payload) - 1))] = draw(st.integers(0, 255))
    return bytes(payload[: draw(st.integers(0, len(payload)))])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), damaged_payload()), min_size=1, max_size=5))
def test_garbage_payloads_with_good_crcs_never_leave_their_record(payloads: list[bytes]) -> None:
    """Whatever the msgpack inside says, the scan stays within each record: the general decoder's
    answer (or its error) is the scan's, or the scan steps aside."""
    data = b"".join(encode_record(i, 0, p) for i, p in enumerate(payloads))
    result = scan_to_arrow(data, 0, len(payloads), "orders", 3, ARROW_SCHEMA)
    if result is not None:
        assert result[0].equals(general(data, 0, len(payloads)))


def test_a_key_of_64_kib_that_is_not_utf8() -> None:
    events = [StoredEvent(id="a", event_type="t", data="x", key=b"\xff" * (2**16 + n)) for n in (0, 1)]
    data = records(events, 0)
    result = scan_to_arrow(data, 0, 2, "orders", 3, ARROW_SCHEMA)
    assert result is not None
    assert result[0].column("key").to_pylist() == [e.key for e in events]
    assert result[0].equals(general(data, 0, 2))


def test_bytes_after_the_event_go_to_the_general_decoder() -> None:
    event = encode_event(StoredEvent(id="a", event_type="t", data="x", key="k"))
    shorter = bytes([0x93]) + event[1:]  # says 3 fields: the key is left over
    assert scan_to_arrow(encode_record(0, 0, shorter), 0, 1, "orders", 3, ARROW_SCHEMA) is None
    assert scan_to_arrow(encode_record(0, 0, event + b"\xc0"), 0, 1, "orders", 3, ARROW_SCHEMA) is None
    assert scan_to_arrow(encode_record(0, 0, event), 0, 1, "orders", 3, ARROW_SCHEMA) is not None


CRCS = [_crc32_tables, _crc32_clmul] if HAS_CLMUL else [_crc32_tables]  # clmul: x86-64 PCLMULQDQ


@pytest.mark.parametrize("crc32", CRCS, ids=lambda f: f.__name__)
@given(data=st.binary(max_size=400), a=st.integers(0, 400), b=st.integers(0, 400))
def test_the_crc_is_zlibs(crc32, data: bytes, a: int, b: int) -> None:  # type: ignore[no-untyped-def]
    start, stop = sorted((min(a, len(data)), min(b, len(data))))
    assert crc32(np.frombuffer(data, np.uint8), start, stop, CRC_TABLE) == zlib.crc32(data[start:stop])


@pytest.mark.parametrize("crc32", CRCS, ids=lambda f: f.__name__)
def test_the_crc_is_zlibs_at_every_length_and_alignment(crc32) -> None:  # type: ignore[no-untyped-def]
    data = np.random.default_rng(7).integers(0, 256, 400, dtype=np.uint8)
    for start in range(16):
        for stop in range(start, 400):
            assert crc32(data, start, stop, CRC_TABLE) == zlib.crc32(data[start:stop].tobytes())


def _well_formed(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@given(st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode)), st.integers(0, 3))
def test_the_utf8_check_is_pythons(data: bytes, cut: int) -> None:
    data = data[: max(0, len(data) - cut)]  # cut characters too
    assert _utf8(np.frombuffer(data, np.uint8), 0, len(data)) == _well_formed(data)


INVALID = [
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf5\x80",
    b"\xe2\x82",
    b"\x80",
    b"\xe0\x9f\xbf",
]
VALID = [b"ascii only!", "é€😀".encode(), b"x" * 17 + "é".encode()]


@pytest.mark.parametrize("text", INVALID + VALID)
def test_the_utf8_check_on_edge_sequences(text: bytes) -> None:
    assert _utf8(np.frombuffer(text, np.uint8), 0, len(text)) == _well_formed(text)


def test_planning_the_source_does_not_load_numba() -> None:
    """Spark's driver and planning workers unpickle the source module; only executors scan records."""
    probe = "import sys, meshplane.spark.pipeline; print('numba' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


def test_an_executor_reuses_the_memory_of_freed_chunks() -> None:
    """Once the scan is loaded, each chunk's columns reuse freed memory: no fresh pages fault in per chunk."""
    probe = """
import resource
from meshplane.core.keys import stored_key
from meshplane.core.streamlog import MarkedEvent, StoredEvent, encode_event, encode_record
from meshplane.spark.decode import ARROW_SCHEMA
from meshplane.spark.reader import _record_scan
event = encode_event(StoredEvent("i" * 24, "e", "x" * 100, "k"))
chunk = b"".join(encode_record(i, 1, event) for i in range(13000))
scan = _record_scan()
scan(chunk, 0, 13000, "t", 0, ARROW_SCHEMA)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    batch, rows = scan(chunk, 0, 13000, "t", 0, ARROW_SCHEMA)
    del batch
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    faults = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert int(faults.stdout) < 100  # 0 here; without the malloc settings, 450
