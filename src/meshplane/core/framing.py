"""Wire framing: the Dynamo 1.6.1 layout (version 1) and the 8-byte-header layout (version 2, from the seed).

See docs/wire.md for the byte-level description. Every decoder raises a :class:`WireError` subclass
that names what was wrong; nothing here does I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum, StrEnum
from typing import NamedTuple

import msgspec

from meshplane.core.envelope import (
    Codec,
    EventEnvelope,
    decode_envelope,
    encode_envelope,
    msgpack_envelope_decoder,
    msgpack_envelope_encoder,
)
from meshplane.errors import (
    MalformedFrame,
    OversizedFrame,
    TruncatedFrame,
    UnexpectedFrameCount,
    UnsupportedVersion,
)

DYNAMO_VERSION = 1
HEADER8_VERSION = 2
_DYNAMO_HEADER = struct.Struct(">BI")  # version, envelope length
_HEADER8 = struct.Struct(">BBBBI")  # version, message type, codec, flags, body length
_U64 = struct.Struct(">Q")
_U64_PAIR = struct.Struct(">QQ")
DYNAMO_HEADER_SIZE = _DYNAMO_HEADER.size
HEADER8_SIZE = _HEADER8.size
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
FRAME_SLACK = 4096  # an envelope's fields around its payload, at most


def max_frame_bytes(max_message_bytes: int) -> int:
    """The largest frame (ZMQ_MAXMSGSIZE) of a socket that takes events of ``max_message_bytes``:
    twice the limit, so that an event a little too large is still read and counted as oversized (its
    publisher stays connected), while libzmq drops a peer that sends one far larger before buffering
    it (a 500 MB frame)."""
    return 2 * max_message_bytes + FRAME_SLACK


# A bare MessagePack envelope (Dynamo over NATS) starts with a map or array marker; neither
# collides with an 8-byte header, whose first byte is the version 2.
_MSGPACK_CONTAINER_MARKERS = frozenset([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])


class WireFormat(StrEnum):
    """Which layout a publisher sends. Receivers accept both."""

    DYNAMO = "dynamo"
    HEADER8 = "header8"  # the 8-byte-header layout (version 2)

    @classmethod
    def _missing_(cls, value: object) -> WireFormat | None:
        return cls.HEADER8 if value == "seed" else None  # its name until 0.1: still accepted


class MessageType(IntEnum):
    EVENT = 1
    HEARTBEAT = 2


_EVENT = MessageType.EVENT
_MSGPACK_MAP_MARKERS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
_decode_map_envelope = msgpack_envelope_decoder.decode
# The first four header bytes of nearly every version-2 message: an event, MessagePack, no flags.
EVENT_MSGPACK_HEAD = bytes([HEADER8_VERSION, MessageType.EVENT, Codec.MSGPACK, 0])


class Frame(NamedTuple):
    """A decoded message: its type, its envelope and the routing topic it arrived under."""

    message_type: MessageType
    envelope: EventEnvelope
    routing_topic: bytes


# NamedTuple's generated __new__ is a Python call; tuple.__new__ builds the same Frame in half the time.
_new_tuple = tuple.__new__


def _check_size(length: int, max_bytes: int) -> None:
    if length > max_bytes:
        raise OversizedFrame(f"envelope of {length} bytes exceeds the limit of {max_bytes} bytes")


#: The first 8 bytes of a common version-2 event (see :func:`_event_head`), by message length.
_EVENT_HEADS: dict[int, bytes] = {}
_EVENT_HEADS_MAX = 4096  # distinct lengths remembered; past that the table starts afresh


def _event_head(length: int) -> bytes:
    """The header a version-2 message of ``length`` bytes has when it is an event in MessagePack, no flags."""
    if len(_EVENT_HEADS) >= _EVENT_HEADS_MAX:
        _EVENT_HEADS.clear()  # bounded whatever lengths arrive
    head = _EVENT_HEADS[length] = EVENT_MSGPACK_HEAD + (length - HEADER8_SIZE).to_bytes(4)
    return head


def decode_header8_event(data: bytes, routing_topic: bytes, max_bytes: int) -> EventEnvelope | Frame:
    """A version-2 message that arrived under the subscriber's own routing topic: an event comes back
    as its bare envelope (the intake then skips the routing-topic check), anything else as a Frame.

    The common case (an event, a MessagePack map, the length as announced) is one dictionary lookup
    and one prefix comparison; anything else takes the checks that say what is wrong. msgspec decodes
    a bytes slice faster than a memoryview of the same bytes.
    """
    length = len(data)
    if HEADER8_SIZE < length <= max_bytes + HEADER8_SIZE:
        head = _EVENT_HEADS.get(length) or _event_head(length)
        if data.startswith(head) and data[HEADER8_SIZE] in _MSGPACK_MAP_MARKERS:
            try:
                envelope: EventEnvelope = _decode_map_envelope(data[HEADER8_SIZE:])
            except ValueError as exc:  # msgspec errors, and UnicodeDecodeError for a bad string
                raise MalformedFrame(f"invalid MSGPACK envelope: {exc}") from exc
            return envelope
    return _decode_header8_checked(data, routing_topic, max_bytes)


def as_frame(item: EventEnvelope | Frame, routing_topic: bytes) -> Frame:
    """A decoder's answer as a Frame (a bare envelope is an event)."""
    if isinstance(item, EventEnvelope):
        return _new_tuple(Frame, (_EVENT, item, routing_topic))
    return item


def _decode_header8_checked(data: bytes, routing_topic: bytes, max_bytes: int) -> Frame:
    if len(data) < HEADER8_SIZE:
        raise TruncatedFrame(f"8-byte header needs {HEADER8_SIZE} bytes, got {len(data)}")
    version, raw_type, raw_codec, flags, length = _HEADER8.unpack_from(data)
    if version != HEADER8_VERSION:
        raise UnsupportedVersion(f"unsupported protocol version {version} (expected {HEADER8_VERSION})")
    try:
        message_type = MessageType(raw_type)
    except ValueError:
        raise MalformedFrame(f"unknown message type {raw_type}") from None
    try:
        codec = Codec(raw_codec)
    except ValueError:
        raise MalformedFrame(f"unknown codec {raw_codec}") from None
    if flags:
        raise MalformedFrame(f"unknown flags 0x{flags:02x} (no flag is defined in version 2)")
    _check_size(length, max_bytes)
    body = memoryview(data)[HEADER8_SIZE:]
    if len(body) < length:
        raise TruncatedFrame(f"header announces {length} body bytes, only {len(body)} arrived")
    if len(body) > length:
        raise MalformedFrame(f"header announces {length} body bytes, {len(body)} arrived")
    return Frame(message_type, decode_envelope(body, codec), routing_topic)


# Heartbeats in the Dynamo layout travel under "<routing topic>/__heartbeat__" with the same suffix on
# the envelope's topic: a Dynamo subscriber drops them as another topic (it checks the envelope topic),
# and no real topic can collide because names cannot contain "/".
HEARTBEAT_SUFFIX = "/__heartbeat__"
HEARTBEAT_SUFFIX_BYTES = HEARTBEAT_SUFFIX.encode()


def _dynamo_heartbeat(envelope: EventEnvelope) -> EventEnvelope:
    return msgspec.structs.replace(envelope, topic=envelope.topic + HEARTBEAT_SUFFIX)


def _classify(envelope: EventEnvelope, routing_topic: bytes) -> EventEnvelope | Frame:
    """A Dynamo-layout envelope is an event (returned bare), unless its topic carries the heartbeat suffix."""
    if envelope.topic.endswith(HEARTBEAT_SUFFIX):
        topic = envelope.topic[: -len(HEARTBEAT_SUFFIX)]
        return Frame(
            MessageType.HEARTBEAT,
            msgspec.structs.replace(envelope, topic=topic),
            routing_topic.removesuffix(HEARTBEAT_SUFFIX_BYTES),
        )
    return envelope


class ZmqEncoder:
    """Builds the multipart frames of one publisher's events (topic and publisher id are fixed)."""

    __slots__ = ("_codec", "_pid_frame", "_routing_topic", "_wire")

    def __init__(self, routing_topic: bytes, publisher_id: int, wire: WireFormat, codec: Codec) -> None:
        self._routing_topic = routing_topic
        self._pid_frame = _U64.pack(publisher_id)
        self._wire = WireFormat(wire)
        self._codec = codec

    @property
    def wire(self) -> WireFormat:
        return self._wire

    @property
    def codec(self) -> Codec:
        return self._codec

    def encode(self, envelope: EventEnvelope, message_type: MessageType = MessageType.EVENT) -> list[bytes]:
        if self._wire is WireFormat.DYNAMO:
            if message_type is MessageType.HEARTBEAT:
                return dynamo_zmq_frames(
                    self._routing_topic + HEARTBEAT_SUFFIX_BYTES, _dynamo_heartbeat(envelope), self._pid_frame
                )
            return dynamo_zmq_frames(self._routing_topic, envelope, self._pid_frame)
        return [self._routing_topic, header8_message(envelope, self._codec, message_type)]

    def event_sender(
        self, send: Callable[[bytes, int], object], more: int, last: int
    ) -> Callable[[EventEnvelope], None]:
        """A function that sends one event's frames through ``send(frame, flags)`` (``more`` on every
        frame but the last): the publisher's hot path, with what is fixed per publisher bound once and
        the MessagePack layouts built without a frame list."""
        topic = self._routing_topic
        encode = msgpack_envelope_encoder.encode
        if self._wire is WireFormat.HEADER8 and self._codec is Codec.MSGPACK:
            heads = _EVENT_HEADS

            def send_header8(envelope: EventEnvelope) -> None:
                body = encode(envelope)
                length = len(body) + HEADER8_SIZE
                send(topic, more)
                send((heads.get(length) or _event_head(length)) + body, last)

            return send_header8
        if self._wire is WireFormat.DYNAMO:
            pid_frame, pack_sequence, pack_header = self._pid_frame, _U64.pack, _DYNAMO_HEADER.pack

            def send_dynamo(envelope: EventEnvelope) -> None:
                body = encode(envelope)
                send(topic, more)
                send(pid_frame, more)
                send(pack_sequence(envelope.sequence), more)
                send(pack_header(DYNAMO_VERSION, len(body)) + body, last)

            return send_dynamo
        encode_frames = self.encode

        def send_frames(envelope: EventEnvelope) -> None:
            *head, tail = encode_frames(envelope)
            for frame in head:
                send(frame, more)
            send(tail, last)

        return send_frames


def header8_message(
    envelope: EventEnvelope, codec: Codec = Codec.MSGPACK, message_type: MessageType = MessageType.EVENT
) -> bytes:
    """The 8-byte header followed by the body (measured: faster than encoding behind a reserved header)."""
    body = encode_envelope(envelope, codec)
    return _HEADER8.pack(HEADER8_VERSION, message_type, codec, 0, len(body)) + body


def dynamo_zmq_frames(
    routing_topic: bytes, envelope: EventEnvelope, pid_frame: bytes | None = None
) -> list[bytes]:
    """The 4 frames Dynamo 1.6.1 sends: topic, publisher id, sequence, header + envelope."""
    body = encode_envelope(envelope)  # header + body joined: measured faster than encoding behind it
    return [
        routing_topic,
        pid_frame if pid_frame is not None else _U64.pack(envelope.publisher_id),
        _U64.pack(envelope.sequence),
        _DYNAMO_HEADER.pack(DYNAMO_VERSION, len(body)) + body,
    ]


def decode_zmq(frames: list[bytes], max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Frame:
    """Decode a ZeroMQ multipart message in either layout (4 frames: Dynamo, 2 frames: 8-byte header)."""
    if len(frames) == 4:
        routing_topic, pid_frame, seq_frame, last = frames
        return as_frame(
            decode_dynamo_event(pid_frame, seq_frame, last, routing_topic, max_bytes), routing_topic
        )
    if len(frames) == 2:
        return as_frame(decode_header8_event(frames[1], frames[0], max_bytes), frames[0])
    raise UnexpectedFrameCount(f"unexpected ZMQ multipart frame count: {len(frames)} (expected 4 or 2)")


def decode_dynamo_event(
    pid_frame: bytes, seq_frame: bytes, last: bytes, routing_topic: bytes, max_bytes: int
) -> EventEnvelope | Frame:
    """Frames 1-3 of a Dynamo-layout ZeroMQ message; an event comes back bare (as
    :func:`decode_header8_event`), a heartbeat as a Frame."""
    if len(last) < DYNAMO_HEADER_SIZE:
        raise TruncatedFrame(f"Dynamo header needs {DYNAMO_HEADER_SIZE} bytes, got {len(last)}")
    version, length = _DYNAMO_HEADER.unpack_from(last)
    if version != DYNAMO_VERSION:
        raise UnsupportedVersion(
            f"unsupported protocol version {version} in a 4-frame message (expected {DYNAMO_VERSION})"
        )
    if length > max_bytes:
        _check_size(length, max_bytes)
    body_length = len(last) - DYNAMO_HEADER_SIZE
    if body_length != length:
        kind = TruncatedFrame if body_length < length else MalformedFrame
        raise kind(f"header announces {length} envelope bytes, {body_length} arrived")
    if len(pid_frame) != 8 or len(seq_frame) != 8:
        raise MalformedFrame("publisher id and sequence frames must be 8 bytes each")
    body = last[DYNAMO_HEADER_SIZE:]  # a bytes slice: msgspec decodes it faster than a memoryview
    if body and body[0] in _MSGPACK_MAP_MARKERS:  # the common case, kept free of extra calls
        try:
            envelope = _decode_map_envelope(body)
        except ValueError as exc:  # msgspec errors, and UnicodeDecodeError for a bad string
            raise MalformedFrame(f"invalid MSGPACK envelope: {exc}") from exc
    else:
        envelope = decode_envelope(body)
    if _U64_PAIR.unpack(pid_frame + seq_frame) != (envelope.publisher_id, envelope.sequence):
        raise MalformedFrame("publisher id / sequence frames disagree with the envelope")
    if envelope.topic.endswith(HEARTBEAT_SUFFIX):
        return _classify(envelope, routing_topic)
    return envelope


def encode_nats(
    envelope: EventEnvelope,
    wire: WireFormat = WireFormat.DYNAMO,
    codec: Codec = Codec.MSGPACK,
    message_type: MessageType = MessageType.EVENT,
) -> bytes:
    """NATS message data: the bare envelope (Dynamo) or an 8-byte header followed by the body.

    A Dynamo-layout heartbeat goes to the subject plus ``HEARTBEAT_SUFFIX`` (the caller's business).
    """
    if wire is WireFormat.DYNAMO:
        if message_type is MessageType.HEARTBEAT:
            return encode_envelope(_dynamo_heartbeat(envelope))
        return encode_envelope(envelope)
    return header8_message(envelope, codec, message_type)


def decode_nats(data: bytes, routing_topic: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Frame:
    """Decode NATS message data in either layout; the first byte tells which."""
    return as_frame(decode_nats_event(data, routing_topic, max_bytes), routing_topic)


def decode_nats_event(data: bytes, routing_topic: bytes, max_bytes: int) -> EventEnvelope | Frame:
    """As :func:`decode_nats`, for a subscriber's own subject: an event comes back bare (as
    :func:`decode_header8_event`)."""
    if not data:
        raise TruncatedFrame("empty NATS message")
    first = data[0]
    if first in _MSGPACK_MAP_MARKERS:  # the common case, kept free of extra calls
        if len(data) > max_bytes:
            _check_size(len(data), max_bytes)
        try:
            envelope: EventEnvelope = _decode_map_envelope(data)
        except ValueError as exc:  # msgspec errors, and UnicodeDecodeError for a bad string
            raise MalformedFrame(f"invalid MSGPACK envelope: {exc}") from exc
        if envelope.topic.endswith(HEARTBEAT_SUFFIX):
            return _classify(envelope, routing_topic)
        return envelope
    if first in _MSGPACK_CONTAINER_MARKERS:
        _check_size(len(data), max_bytes)
        return _classify(decode_envelope(data), routing_topic)
    if first == HEADER8_VERSION:
        return decode_header8_event(data, routing_topic, max_bytes)
    raise UnsupportedVersion(
        f"NATS message starts with 0x{first:02x}: neither a MessagePack envelope nor protocol version "
        f"{HEADER8_VERSION}"
    )
