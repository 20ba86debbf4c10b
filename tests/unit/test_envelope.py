import contextlib

import msgpack
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane import EventEnvelope, WireError
from meshplane.core.envelope import Codec, decode_envelope, encode_envelope

u64 = st.integers(min_value=0, max_value=2**64 - 1)
envelopes = st.builds(EventEnvelope, u64, u64, u64, st.text(max_size=40), st.binary(max_size=300))


def as_dict(e: EventEnvelope) -> dict[str, object]:
    return {
        "publisher_id": e.publisher_id,
        "sequence": e.sequence,
        "published_at": e.published_at,
        "topic": e.topic,
        "payload": e.payload,
    }


@given(envelopes)
def test_msgpack_encoding_is_byte_identical_to_msgpack_packb_of_the_dict(envelope):
    assert encode_envelope(envelope) == msgpack.packb(as_dict(envelope), use_bin_type=True)


@given(envelopes, st.sampled_from(list(Codec)))
def test_round_trip_in_both_codecs(envelope, codec):
    assert decode_envelope(encode_envelope(envelope, codec), codec) == envelope


@given(envelopes)
def test_array_form_is_accepted(envelope):
    data = msgpack.packb(list(as_dict(envelope).values()), use_bin_type=True)
    assert decode_envelope(data) == envelope


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x85",  # map header and nothing else
        msgpack.packb({"publisher_id": 1, "sequence": 2}),  # missing fields
        msgpack.packb({"publisher_id": -1, "sequence": 0, "published_at": 0, "topic": "t", "payload": b""}),
        msgpack.packb({"publisher_id": 1, "sequence": 0, "published_at": 0, "topic": 5, "payload": b""}),
        msgpack.packb([1, 2, 3]),
        b"\xc1",  # never-used marker
        b"\x95\x00\x00\x00\xa5\x00\x00\x00\x00\x80",  # array form, topic not UTF-8 (found by hypothesis)
        msgpack.packb(
            {"publisher_id": 1, "sequence": 0, "published_at": 0, "topic": b"\x80", "payload": b""}
        ),
    ],
)
def test_malformed_envelopes_raise_wire_errors(data):
    with pytest.raises(WireError):
        decode_envelope(data)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_wire_errors(data):
    with contextlib.suppress(WireError):
        decode_envelope(data)


def test_decode_payload_into_types():
    class Stored(msgspec.Struct):
        block: int

    envelope = EventEnvelope(1, 0, 0, "t", msgspec.msgpack.encode({"block": 7}))
    assert envelope.decode() == {"block": 7}
    assert envelope.decode(Stored) == Stored(7)
    with pytest.raises(WireError, match="is not a"):
        EventEnvelope(1, 0, 0, "t", b"\xc1").decode()
