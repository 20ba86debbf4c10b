"""The mesh frame reader's C loop (``_frames.c``) against the Python reader: for any stream, sound or
damaged, cut anywhere, both give the same frames and errors, the same pending bytes, the same end. The
C encoder against the Python one: the same bytes, or the same error, for any arguments."""

from __future__ import annotations

import itertools
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.compiled import compiled
from meshplane.core.mesh import frames as frames_module
from meshplane.core.mesh.frames import (
    _STAMP,
    Frame,
    FrameError,
    FrameReader,
    FrameType,
    decode_spooled,
    encode_event,
    encode_frame,
    python_encode_frame,
)

MAX_PAYLOAD = 400


def test_the_extension_is_built_and_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert frames_module._native_read is not None, (
        "the C extension was not built: `pip install -e .` needs a C compiler"
    )
    assert frames_module._native_encode is not None
    monkeypatch.setenv("MESHPLANE_NO_EXTENSIONS", "1")
    assert compiled("meshplane.core.mesh._frames") is None


def damaged(frame: bytes, how: str, where: int) -> bytes:
    """``frame`` with a flipped byte (checksum), a foreign type, a source or subject that is not
    UTF-8, a lying length, or left as it is."""
    data = bytearray(frame)
    subject_length = struct.unpack_from(">H", data, 18)[0]
    if how == "flip":
        data[where % len(data)] ^= 0x5A
    elif how == "type":
        data[0] = 13 + where % 243
    elif how == "text":
        data[2 + where % 16] = 0xFF
    elif how == "subject" and subject_length:
        data[20 + where % subject_length] = 0xC3
    elif how == "payload_length":
        struct.pack_into(">I", data, 20 + subject_length + 8, MAX_PAYLOAD + 1 + where)
    elif how == "subject_length":
        struct.pack_into(">H", data, 18, 1024 + where)
    elif how == "short_event":
        data[0] = 3  # an EVENT whose payload may be shorter than its timestamp
    if how in ("type", "text", "subject", "short_event"):  # a sound checksum over the damage
        body = bytes(data[:-4])
        data[-4:] = struct.pack(">I", zlib.crc32(body))
    return bytes(data)


FRAME = st.builds(
    lambda kind, flags, source, subject, sequence, payload, how, where: damaged(
        encode_frame(kind, source, subject, sequence, payload, flags), how, where
    ),
    st.integers(1, 12),
    st.integers(0, 255),
    st.sampled_from(["a", "node-b", "n" * 16, "é"]),
    st.sampled_from(["", "orders.eu", "x" * 300, "ünï.cødé"]),
    st.integers(0, 2**64 - 1),
    st.binary(max_size=MAX_PAYLOAD),
    st.sampled_from(
        ["none"] * 6 + ["flip", "type", "text", "subject", "payload_length", "subject_length", "short_event"]
    ),
    st.integers(0, 10_000),
)


def read(stream: bytes, cuts: list[int], native: bool) -> tuple[list[object], list[int], bool]:
    reader = FrameReader(MAX_PAYLOAD)
    if not native:
        reader._read_frames = None
    else:
        assert reader._read_frames is not None
    out: list[object] = []
    pending = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        for item in reader.feed(stream[start:end]):
            out.append((item, item.raw) if isinstance(item, Frame) else item)
        pending.append(reader.pending)
    return out, pending, reader.broken


@settings(max_examples=400)
@given(st.lists(FRAME, max_size=12), st.data())
def test_the_c_loop_reads_every_stream_as_the_python_reader_does(
    frames: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    assert read(stream, cuts, native=True) == read(stream, cuts, native=False)


@given(st.lists(st.binary(max_size=200), max_size=6))
def test_garbage_is_read_alike(chunks: list[bytes]) -> None:
    stream = b"".join(chunks)
    cuts = list(itertools.accumulate(len(c) for c in chunks))[:-1]
    assert read(stream, cuts, native=True) == read(stream, cuts, native=False)


def test_the_c_loop_stops_for_text_it_has_not_seen_and_the_reader_learns_it() -> None:
    reader = FrameReader()
    stream = b"".join(
        encode_frame(frames_module.FrameType.EVENT, "n", f"s.{i % 3}", i, b"12345678") for i in range(9)
    )
    got = reader.feed(stream)
    assert [(f.subject, f.sequence) for f in got if isinstance(f, Frame)] == [
        (f"s.{i % 3}", i) for i in range(9)
    ]
    assert not [f for f in got if isinstance(f, FrameError)]
    assert set(reader._text.values()) == {"n", "s.0", "s.1", "s.2"}


def outcome(encode: object, *args: object) -> object:
    try:
        return encode(*args)  # type: ignore[operator]
    except Exception as exc:  # the same kind of error, whichever encoder
        return type(exc)


INTS = st.one_of(st.integers(-2, 300), st.integers(2**64 - 2, 2**64 + 1), st.sampled_from(list(FrameType)))
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["\ud800", "n" * 17, "é" * 9]))


@settings(max_examples=400)
@given(
    INTS,
    INTS,
    TEXT,
    TEXT,
    INTS,
    st.one_of(st.binary(max_size=50), st.builds(bytearray, st.binary(max_size=9))),
)
def test_the_c_encoder_makes_the_python_encoders_bytes_or_leaves_it_the_case(
    kind: int, flags: int, source: str, subject: str, sequence: int, payload: bytes
) -> None:
    expected = outcome(python_encode_frame, kind, source, subject, sequence, payload, flags)
    assert outcome(encode_frame, kind, source, subject, sequence, payload, flags) == expected
    stamp = sequence
    stamped = outcome(lambda: _STAMP.pack(stamp) + payload)
    if isinstance(stamped, bytes):
        expected = outcome(python_encode_frame, FrameType.EVENT, source, subject, kind, stamped, flags)
    assert outcome(encode_event, source, subject, kind, stamp, payload, flags) == (
        expected if isinstance(stamped, bytes) else stamped
    )


def test_a_subject_too_long_for_its_length_field_is_left_to_python() -> None:
    assert outcome(encode_frame, FrameType.SUB_ADD, "n", "s" * 65_536) is struct.error


@settings(max_examples=300)
@given(st.lists(FRAME, max_size=3), st.binary(max_size=20), st.integers(0, 3))
def test_a_spooled_frames_event_is_read_alike(frames: list[bytes], garbage: bytes, where: int) -> None:
    payload = b"".join(frames)
    payload = (payload, payload, payload + garbage, garbage + payload)[where]  # whole, or with bytes around
    spooled = Frame(FrameType.SPOOLED, 0, "n", "", 1, payload)

    def python_decode(frame: Frame) -> Frame:
        native, frames_module._native_read = frames_module._native_read, None
        try:
            return decode_spooled(frame, MAX_PAYLOAD)
        finally:
            frames_module._native_read = native

    native = outcome(decode_spooled, spooled, MAX_PAYLOAD)
    python = outcome(python_decode, spooled)
    assert native == python
    if isinstance(native, Frame) and isinstance(python, Frame):
        assert native.raw == python.raw
