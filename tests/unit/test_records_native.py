"""The partition log's C record loop and encoder (``core/_records.c``) against the Python ones: for
any buffer, sound, torn, garbled or out of sequence, and any bounds, the same records, the same end
and the same problem; for any arguments, the same record bytes or the same error."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core import streamlog
from meshplane.core.compiled import compiled
from meshplane.core.streamlog import (
    ScanResult,
    encode_record,
    python_encode_record,
    scan_records,
)


@pytest.fixture
def python_only() -> Iterator[None]:
    native, streamlog._native = streamlog._native, None
    try:
        yield
    finally:
        streamlog._native = native


def test_the_extension_is_built_and_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert streamlog._native is not None, (
        "the C extension was not built: `pip install -e .` needs a C compiler"
    )
    monkeypatch.setenv("MESHPLANE_NO_EXTENSIONS", "1")
    assert compiled("meshplane.core._records") is None


def both(buffer: bytes, **bounds: int | None) -> tuple[ScanResult, ScanResult]:
    native = scan_records(buffer, **bounds)  # type: ignore[arg-type]
    saved, streamlog._native = streamlog._native, None
    try:
        python = scan_records(buffer, **bounds)  # type: ignore[arg-type]
    finally:
        streamlog._native = saved
    return native, python


def damage(buffer: bytes, how: str, where: int) -> bytes:
    if not buffer:
        return buffer
    data = bytearray(buffer)
    if how == "flip":
        data[where % len(data)] ^= 0x41
    elif how == "tear":
        del data[where % len(data) :]
    elif how == "length":
        struct.pack_into(">I", data, 0, [3, 64 * 1024 * 1024 + 1, 2**32 - 1][where % 3])
    elif how == "append":
        data += bytes([where % 256]) * (where % 30)
    return bytes(data)


RECORDS = st.lists(
    st.tuples(st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1), st.binary(max_size=60)), max_size=8
)


@settings(max_examples=400)
@given(
    RECORDS,
    st.booleans(),
    st.sampled_from(["none", "none", "flip", "tear", "length", "append"]),
    st.integers(0, 10_000),
    st.one_of(st.none(), st.integers(-2, 2**64 + 1)),
    st.one_of(st.none(), st.integers(0, 9)),
    st.integers(0, 1000),
)
def test_the_c_loop_scans_every_buffer_as_the_python_loop_does(
    records: list[tuple[int, int, bytes]],
    in_sequence: bool,
    how: str,
    where: int,
    expected: int | None,
    max_records: int | None,
    start_position: int,
) -> None:
    if in_sequence and records:
        first = records[0][0] % 2**63
        records = [(first + n, stamp, payload) for n, (_, stamp, payload) in enumerate(records)]
    buffer = damage(b"".join(encode_record(*record) for record in records), how, where)
    native, python = both(
        buffer, expected_offset=expected, max_records=max_records, start_position=start_position
    )
    assert native == python


def test_a_record_at_the_last_offset_ends_the_sequence() -> None:
    last = 2**64 - 1
    buffer = encode_record(last, 0, b"a") + encode_record(0, 0, b"b")
    native, python = both(buffer)
    assert native == python
    assert native.problem == f"offset 0 where {last + 1} was expected"


@pytest.mark.parametrize("length", [0, 8, 15])
def test_a_record_shorter_than_its_header_is_refused_even_with_a_matching_crc(length: int) -> None:
    body = bytes(range(1, 17))[:length]
    buffer = (
        struct.pack(">II", length, zlib.crc32(body)) + body + bytes(16 - length) + encode_record(0, 0, b"x")
    )
    native, python = both(buffer)
    assert native == python
    assert native.problem == f"bad record length {length}"


def outcome(encode: object, *args: object) -> object:
    try:
        return encode(*args)  # type: ignore[operator]
    except Exception as exc:  # the same kind of error, whichever encoder
        return type(exc)


@settings(max_examples=300)
@given(
    st.one_of(st.integers(-2, 3), st.integers(2**64 - 2, 2**64 + 1), st.booleans()),
    st.one_of(st.integers(-(2**63) - 1, -(2**63) + 1), st.integers(2**63 - 1, 2**63), st.integers(-5, 5)),
    st.one_of(st.binary(max_size=40), st.builds(bytearray, st.binary(max_size=5))),
)
def test_the_c_encoder_makes_the_python_encoders_bytes_or_leaves_it_the_case(
    offset: int, timestamp_ms: int, payload: bytes
) -> None:
    assert outcome(encode_record, offset, timestamp_ms, payload) == outcome(
        python_encode_record, offset, timestamp_ms, payload
    )


def test_python_only_still_scans(python_only: None) -> None:
    result = scan_records(encode_record(5, 1, b"x") + encode_record(6, 2, b"y"), expected_offset=5)
    assert [(r.offset, r.payload) for r in result.records] == [(5, b"x"), (6, b"y")]
