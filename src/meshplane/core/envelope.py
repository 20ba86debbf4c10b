"""The event envelope and its two codecs (MessagePack as Dynamo writes it, and JSON)."""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Any, TypeVar, overload

import msgspec

from meshplane.errors import MalformedFrame

U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgpack itself caps at 2**64 - 1
T = TypeVar("T")


class EventEnvelope(msgspec.Struct, frozen=True, gc=False):
    """One event as it travels: who published it, its place in that publisher's stream, and its bytes.

    Field order is the wire order: ``msgspec`` writes a map in declaration order with minimal integer
    encodings, which reproduces ``msgpack.packb(dict, use_bin_type=True)`` byte for byte.
    """

    publisher_id: U64
    sequence: U64
    published_at: U64  # Unix milliseconds
    topic: str
    payload: bytes

    @overload
    def decode(self) -> Any: ...
    @overload
    def decode(self, type: type[T]) -> T: ...
    def decode(self, type: Any = Any) -> Any:
        """Decode the MessagePack payload, optionally into ``type`` (msgspec Struct, dataclass, dict...)."""
        try:
            return msgspec.msgpack.decode(self.payload, type=type)
        except ValueError as exc:  # msgspec errors, and UnicodeDecodeError for a bad string
            raise MalformedFrame(
                f"payload of {self.topic!r} #{self.sequence} is not a {type}: {exc}"
            ) from exc


class _EnvelopeArray(msgspec.Struct, array_like=True, gc=False):
    publisher_id: U64
    sequence: U64
    published_at: U64
    topic: str
    payload: bytes


class Codec(IntEnum):
    """How the envelope body is serialised (8-byte-header layout only; Dynamo's is always MessagePack)."""

    MSGPACK = 1
    JSON = 2


msgpack_envelope_encoder = msgspec.msgpack.Encoder()  # shared with the hot paths, as the decoder
msgpack_envelope_decoder = msgspec.msgpack.Decoder(EventEnvelope)  # the map form, for hot paths
_msgpack_array_decoder = msgspec.msgpack.Decoder(_EnvelopeArray)
_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(EventEnvelope)
_MSGPACK_ARRAY_MARKERS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])


def encode_envelope(envelope: EventEnvelope, codec: Codec = Codec.MSGPACK) -> bytes:
    if codec is Codec.JSON:
        return _json_encoder.encode(envelope)
    return msgpack_envelope_encoder.encode(envelope)


def decode_envelope(data: bytes | memoryview, codec: Codec = Codec.MSGPACK) -> EventEnvelope:
    """Decode an envelope; MessagePack input may be the map Dynamo writes or a five-element array."""
    try:
        if codec is Codec.JSON:
            return _json_decoder.decode(data)
        if data and data[0] in _MSGPACK_ARRAY_MARKERS:
            a = _msgpack_array_decoder.decode(data)
            return EventEnvelope(a.publisher_id, a.sequence, a.published_at, a.topic, a.payload)
        return msgpack_envelope_decoder.decode(data)
    except ValueError as exc:  # msgspec errors, and UnicodeDecodeError for a bad string
        raise MalformedFrame(f"invalid {codec.name} envelope: {exc}") from exc
