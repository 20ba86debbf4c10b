import contextlib
import struct
from collections.abc import Callable

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane import EventEnvelope, WireError
from meshplane.core.envelope import Codec, encode_envelope
from meshplane.core.framing import (
    Frame,
    MessageType,
    WireFormat,
    ZmqEncoder,
    decode_nats,
    decode_zmq,
    dynamo_zmq_frames,
    encode_nats,
)
from meshplane.errors import (
    MalformedFrame,
    OversizedFrame,
    TruncatedFrame,
    UnexpectedFrameCount,
    UnsupportedVersion,
)

u64 = st.integers(min_value=0, max_value=2**64 - 1)
envelopes = st.builds(EventEnvelope, u64, u64, u64, st.text(max_size=40), st.binary(max_size=300))

# The capture in the spec: publisher 0x0007d4878fd52789, sequence 2, a 0xac-byte envelope.
SPEC_PREFIX = (
    bytes.fromhex("01000000ac85")
    + b"\xacpublisher_id"
    + bytes.fromhex("cf0007d4878fd52789")
    + b"\xa8sequence\x02"
)


def spec_like_envelope() -> EventEnvelope:
    # 69 bytes of map structure + topic (1 + 20) + payload (2 + 80) = 172 = 0xac
    return EventEnvelope(0x0007D4878FD52789, 2, 1769000000000, "forward-pass-metrics", bytes(range(80)))


def test_golden_bytes_of_the_dynamo_layout():
    envelope = spec_like_envelope()
    frames = [bytes(f) for f in dynamo_zmq_frames(b"forward-pass-metrics", envelope)]
    assert frames[0] == b"forward-pass-metrics"
    assert frames[1] == bytes.fromhex("0007d4878fd52789")
    assert frames[2] == bytes.fromhex("0000000000000002")
    assert frames[3].startswith(SPEC_PREFIX)
    assert len(frames[3]) == 5 + 0xAC
    body = {
        "publisher_id": envelope.publisher_id,
        "sequence": 2,
        "published_at": envelope.published_at,
        "topic": envelope.topic,
        "payload": envelope.payload,
    }
    assert frames[3][5:] == msgpack.packb(body, use_bin_type=True)


def test_nats_dynamo_layout_is_the_bare_envelope():
    envelope = spec_like_envelope()
    assert encode_nats(envelope) == encode_envelope(envelope)


@given(envelopes, st.sampled_from(list(WireFormat)), st.sampled_from(list(Codec)))
def test_zmq_round_trip_in_both_layouts(envelope, wire, codec):
    frames = ZmqEncoder(b"topic", envelope.publisher_id, wire, codec).encode(envelope)
    assert len(frames) == (4 if wire is WireFormat.DYNAMO else 2)
    decoded = decode_zmq([bytes(f) for f in frames])
    assert decoded.envelope == envelope
    assert decoded.routing_topic == b"topic"
    assert decoded.message_type is MessageType.EVENT


@given(envelopes, st.sampled_from(list(WireFormat)), st.sampled_from(list(Codec)))
def test_nats_round_trip_in_both_layouts(envelope, wire, codec):
    decoded = decode_nats(encode_nats(envelope, wire, codec), b"subj")
    assert decoded.envelope == envelope


def test_seed_header_layout():
    envelope = spec_like_envelope()
    data = encode_nats(envelope, WireFormat.HEADER8, Codec.JSON, MessageType.HEARTBEAT)
    version, message_type, codec, flags, length = struct.unpack(">BBBBI", data[:8])
    assert (version, message_type, codec, flags) == (2, 2, 2, 0)
    assert length == len(data) - 8
    assert decode_nats(data, b"s").message_type is MessageType.HEARTBEAT


def dynamo_frames() -> list[bytes]:
    return [bytes(f) for f in dynamo_zmq_frames(b"t", EventEnvelope(1, 2, 3, "t", b"payload"))]


def seed_frames() -> list[bytes]:
    return [
        bytes(f)
        for f in ZmqEncoder(b"t", 1, WireFormat.HEADER8, Codec.MSGPACK).encode(
            EventEnvelope(1, 2, 3, "t", b"p")
        )
    ]


def with_last(frames: list[bytes], last: bytes) -> list[bytes]:
    return [*frames[:-1], last]


@pytest.mark.parametrize(
    ("frames", "error", "message"),
    [
        (dynamo_frames()[:3], UnexpectedFrameCount, "frame count: 3"),
        ([b"t"], UnexpectedFrameCount, "frame count: 1"),
        (with_last(dynamo_frames(), b"\x01\x00"), TruncatedFrame, "needs 5 bytes"),
        (with_last(dynamo_frames(), b"\x02" + dynamo_frames()[3][1:]), UnsupportedVersion, "version 2"),
        (with_last(dynamo_frames(), dynamo_frames()[3][:-1]), TruncatedFrame, "announces"),
        (with_last(dynamo_frames(), dynamo_frames()[3] + b"x"), MalformedFrame, "announces"),
        ([b"t", b"\x00" * 8, b"\x00" * 7 + b"\x02", dynamo_frames()[3]], MalformedFrame, "disagree"),
        ([b"t", b"\x00" * 4, b"\x00" * 8, dynamo_frames()[3]], MalformedFrame, "8 bytes"),
        (with_last(seed_frames(), b"\x01" + seed_frames()[1][1:]), UnsupportedVersion, "version 1"),
        (with_last(seed_frames(), seed_frames()[1][:6]), TruncatedFrame, "8-byte header"),
        (with_last(seed_frames(), seed_frames()[1][:-2]), TruncatedFrame, "announces"),
        (
            with_last(seed_frames(), seed_frames()[1][:1] + b"\x09" + seed_frames()[1][2:]),
            MalformedFrame,
            "message type",
        ),
        (
            with_last(seed_frames(), seed_frames()[1][:2] + b"\x09" + seed_frames()[1][3:]),
            MalformedFrame,
            "codec",
        ),
        (
            with_last(seed_frames(), seed_frames()[1][:3] + b"\x80" + seed_frames()[1][4:]),
            MalformedFrame,
            "flags",
        ),
        (
            with_last(seed_frames(), seed_frames()[1][:8] + b"\xc1" * (len(seed_frames()[1]) - 8)),
            MalformedFrame,
            "envelope",
        ),
    ],
)
def test_malformed_zmq_messages_get_precise_errors(frames, error, message):
    with pytest.raises(error, match=message):
        decode_zmq(frames)


def test_oversized_messages_are_rejected_before_decoding():
    envelope = EventEnvelope(1, 2, 3, "t", b"x" * 1000)
    with pytest.raises(OversizedFrame, match="exceeds the limit of 100"):
        decode_zmq([bytes(f) for f in dynamo_zmq_frames(b"t", envelope)], max_bytes=100)
    with pytest.raises(OversizedFrame):
        decode_nats(encode_nats(envelope), b"s", max_bytes=100)
    with pytest.raises(OversizedFrame):
        decode_nats(encode_nats(envelope, WireFormat.HEADER8), b"s", max_bytes=100)
    # a header that lies about a huge body is refused without waiting for it
    with pytest.raises(OversizedFrame):
        decode_zmq([b"t", b"\x00" * 8, b"\x00" * 8, b"\x01\xff\xff\xff\xff"], max_bytes=100)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", TruncatedFrame),
        (b"\x01\x00", UnsupportedVersion),
        (b"{}", UnsupportedVersion),
        (b"\x02\x01", TruncatedFrame),
    ],
)
def test_malformed_nats_messages(data, error):
    with pytest.raises(error):
        decode_nats(data, b"s")


@given(st.lists(st.binary(max_size=64), min_size=0, max_size=5))
def test_arbitrary_zmq_frames_raise_only_wire_errors(frames):
    with contextlib.suppress(WireError):
        decode_zmq(frames)


@given(st.binary(max_size=200))
def test_arbitrary_nats_data_raises_only_wire_errors(data):
    with contextlib.suppress(WireError):
        decode_nats(data, b"s")


def _outcome(decode: Callable[..., Frame], *args: object) -> Frame | type[WireError]:
    try:
        return decode(*args)
    except WireError as exc:
        return type(exc)


@given(
    st.one_of(
        envelopes.map(lambda e: bytes(encode_nats(e, WireFormat.HEADER8))),
        st.binary(max_size=40).map(lambda tail: bytes([2, 1, 1, 0]) + tail),
        st.tuples(envelopes, st.integers(0, 300), st.binary(max_size=3)).map(
            lambda t: bytes(encode_nats(t[0], WireFormat.HEADER8))[: t[1]] + t[2]
        ),
    ),
    st.sampled_from([64, 8 * 1024 * 1024]),
)
def test_the_header8_fast_path_decodes_exactly_as_the_checked_path(data, max_bytes):
    from meshplane.core.framing import _decode_header8_checked, as_frame, decode_header8_event

    def fast(data: bytes, topic: bytes, max_bytes: int) -> Frame:
        return as_frame(decode_header8_event(data, topic, max_bytes), topic)

    assert _outcome(fast, data, b"t", max_bytes) == _outcome(_decode_header8_checked, data, b"t", max_bytes)


def test_the_header8_fast_path_refuses_a_length_it_remembers_from_a_larger_limit() -> None:
    from meshplane.core.framing import decode_header8_event

    data = bytes(encode_nats(EventEnvelope(1, 0, 0, "t", b"x" * 100), WireFormat.HEADER8))
    assert isinstance(decode_header8_event(data, b"t", 8 * 1024 * 1024), EventEnvelope)  # remembered
    with pytest.raises(OversizedFrame):
        decode_header8_event(data, b"t", 64)


def test_the_table_of_header8_event_heads_stays_bounded() -> None:
    from meshplane.core.framing import _EVENT_HEADS, _EVENT_HEADS_MAX, decode_header8_event

    for size in range(_EVENT_HEADS_MAX + 100):
        data = bytes(encode_nats(EventEnvelope(1, 0, 0, "t", b"x" * size), WireFormat.HEADER8))
        assert decode_header8_event(data, b"t", 1 << 20).payload == b"x" * size  # type: ignore[union-attr]
        assert len(_EVENT_HEADS) <= _EVENT_HEADS_MAX
