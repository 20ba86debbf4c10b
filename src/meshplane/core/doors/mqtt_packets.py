"""MQTT 3.1.1 and 5 packets, as values, and their encoding (sans I/O; decoding: :mod:`.mqtt_codec`).

One class per control packet a server reads or writes; QoS 2's PUBREC/PUBREL/PUBCOMP and 5's AUTH
have none (the door refuses QoS 2 and enhanced authentication). MQTT 5's properties are kept as a
mapping from the property's identifier to its value (user properties: a tuple of pairs).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any

from meshplane.core.compiled import compiled
from meshplane.errors import WireError

V311 = 4  # the protocol levels a CONNECT names
V5 = 5
MAX_REMAINING_LENGTH = 268_435_455  # four bytes of variable-length integer
Properties = Mapping[int, object]
NO_PROPERTIES: Properties = MappingProxyType({})


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class Code(IntEnum):
    """MQTT 5's reason codes the door sends (3.1.1's CONNACK return codes: :data:`V311_CONNACK`)."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    DISCONNECT_WITH_WILL = 0x04
    NO_SUBSCRIPTION_EXISTED = 0x11
    UNSPECIFIED = 0x80
    MALFORMED = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC = 0x83
    UNSUPPORTED_VERSION = 0x84
    BAD_CLIENT_ID = 0x85
    BAD_USER_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    BAD_TOPIC_FILTER = 0x8F
    BAD_TOPIC_NAME = 0x90
    PACKET_ID_IN_USE = 0x91
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99
    QOS_NOT_SUPPORTED = 0x9B
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E


# A 5 reason code as 3.1.1's CONNACK return code (1 version, 2 identifier, 3 unavailable, 4 user or
# password, 5 not authorized).
V311_CONNACK = {
    Code.SUCCESS: 0,
    Code.UNSUPPORTED_VERSION: 1,
    Code.BAD_CLIENT_ID: 2,
    Code.SERVER_UNAVAILABLE: 3,
    Code.SERVER_BUSY: 3,
    Code.QUOTA_EXCEEDED: 3,
    Code.BAD_USER_OR_PASSWORD: 4,
    Code.NOT_AUTHORIZED: 5,
}


class MqttError(WireError):
    """Bytes that break MQTT's rules: the connection is closed (with MQTT 5, after a DISCONNECT with
    ``code``; a CONNECT's problem answered with a CONNACK instead). ``reason`` is a counter label."""

    def __init__(self, reason: str, detail: str, code: int = Code.MALFORMED, *, in_connect: bool = False):
        super().__init__(detail)
        self.reason = reason
        self.code = code
        self.in_connect = in_connect  # answered with a CONNACK carrying ``code``


class Prop(IntEnum):
    PAYLOAD_FORMAT = 0x01
    MESSAGE_EXPIRY = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_ID = 0x0B
    SESSION_EXPIRY = 0x11
    ASSIGNED_CLIENT_ID = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTH_METHOD = 0x15
    AUTH_DATA = 0x16
    REQUEST_PROBLEM_INFO = 0x17
    WILL_DELAY = 0x18
    REQUEST_RESPONSE_INFO = 0x19
    RESPONSE_INFO = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_AVAILABLE = 0x28
    SUBSCRIPTION_ID_AVAILABLE = 0x29
    SHARED_AVAILABLE = 0x2A


# Each property's type: byte, two (bytes), four, varint, utf8, binary, pair (of utf8 strings).
PROPERTY_TYPES: dict[int, str] = {
    Prop.PAYLOAD_FORMAT: "byte",
    Prop.MESSAGE_EXPIRY: "four",
    Prop.CONTENT_TYPE: "utf8",
    Prop.RESPONSE_TOPIC: "utf8",
    Prop.CORRELATION_DATA: "binary",
    Prop.SUBSCRIPTION_ID: "varint",
    Prop.SESSION_EXPIRY: "four",
    Prop.ASSIGNED_CLIENT_ID: "utf8",
    Prop.SERVER_KEEP_ALIVE: "two",
    Prop.AUTH_METHOD: "utf8",
    Prop.AUTH_DATA: "binary",
    Prop.REQUEST_PROBLEM_INFO: "byte",
    Prop.WILL_DELAY: "four",
    Prop.REQUEST_RESPONSE_INFO: "byte",
    Prop.RESPONSE_INFO: "utf8",
    Prop.SERVER_REFERENCE: "utf8",
    Prop.REASON_STRING: "utf8",
    Prop.RECEIVE_MAXIMUM: "two",
    Prop.TOPIC_ALIAS_MAXIMUM: "two",
    Prop.TOPIC_ALIAS: "two",
    Prop.MAXIMUM_QOS: "byte",
    Prop.RETAIN_AVAILABLE: "byte",
    Prop.USER_PROPERTY: "pair",
    Prop.MAXIMUM_PACKET_SIZE: "four",
    Prop.WILDCARD_AVAILABLE: "byte",
    Prop.SUBSCRIPTION_ID_AVAILABLE: "byte",
    Prop.SHARED_AVAILABLE: "byte",
}


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class Connect:
    level: int  # V311 or V5
    client_id: str
    clean: bool = True  # 3.1.1's clean session, 5's clean start
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class ConnAck:
    session_present: bool = False
    code: int = Code.SUCCESS  # a 5 reason code; sent as 3.1.1's return code to a 3.1.1 client
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0  # QoS 1 and 2 only
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class PubAck:
    packet_id: int
    code: int = Code.SUCCESS
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    filters: tuple[tuple[str, int], ...]  # (filter, options): the options' two low bits are the QoS
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    codes: tuple[int, ...]
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int
    codes: tuple[int, ...] = ()  # 5 only
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    code: int = Code.SUCCESS  # 5 only
    properties: Properties = field(default_factory=lambda: NO_PROPERTIES)


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
)


# --- encoding ----------------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    """MQTT's variable-length integer (1-4 bytes, up to :data:`MAX_REMAINING_LENGTH`)."""
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"{value} does not fit MQTT's variable-length integer")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def utf8(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def binary(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def encode_properties(properties: Properties) -> bytes:
    out = bytearray()
    for key, value in properties.items():
        kind = PROPERTY_TYPES[key]
        values: Any = value if kind == "pair" else (value,)
        for one in values:
            out += varint(key)
            if kind == "byte":
                out.append(one)
            elif kind == "two":
                out += struct.pack("!H", one)
            elif kind == "four":
                out += struct.pack("!I", one)
            elif kind == "varint":
                out += varint(one)
            elif kind == "utf8":
                out += utf8(one)
            elif kind == "binary":
                out += binary(one)
            else:
                out += utf8(one[0]) + utf8(one[1])
    return varint(len(out)) + out


def _packet(kind: PacketType, flags: int, body: bytes) -> bytes:
    return bytes([kind << 4 | flags]) + varint(len(body)) + body


def encode_publish(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int, level: int
) -> bytes:
    """A PUBLISH without properties: what a broker sends most, made without a packet object."""
    head = bytes([PacketType.PUBLISH << 4 | dup << 3 | qos << 1 | retain])
    name = topic.encode()
    size = 2 + len(name) + (2 if qos else 0) + (level == V5) + len(payload)
    ident = packet_id.to_bytes(2, "big") if qos else b""
    props = b"\x00" if level == V5 else b""
    return b"".join((head, varint(size), len(name).to_bytes(2, "big"), name, ident, props, payload))


_native = compiled("meshplane.core.doors._mqtt")
#: :func:`encode_publish`, made in C where it is built (``_mqtt.c``: the same bytes, in one allocation)
publish_bytes: Callable[[str, bytes, int, bool, bool, int, int], bytes] = (
    encode_publish if _native is None else _native.encode_publish
)


def encode_puback(packet_id: int) -> bytes:
    """A successful PUBACK (the same bytes in 3.1.1 and 5: 5 leaves out a success code)."""
    return b"\x40\x02" + packet_id.to_bytes(2, "big")


def encode(packet: Packet, level: int) -> bytes:
    """``packet``'s bytes for a connection of protocol ``level``."""
    v5 = level == V5

    def props(properties: Properties) -> bytes:
        return encode_properties(properties) if v5 else b""

    if isinstance(packet, Publish):
        if not packet.properties:
            return encode_publish(
                packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id, level
            )
        flags = packet.dup << 3 | packet.qos << 1 | packet.retain
        body = utf8(packet.topic) + (struct.pack("!H", packet.packet_id) if packet.qos else b"")
        return _packet(PacketType.PUBLISH, flags, body + props(packet.properties) + packet.payload)
    if isinstance(packet, PubAck):
        tail = b""
        if v5 and (packet.code or packet.properties):
            tail = bytes([packet.code]) + (encode_properties(packet.properties) if packet.properties else b"")
        return _packet(PacketType.PUBACK, 0, struct.pack("!H", packet.packet_id) + tail)
    if isinstance(packet, ConnAck):
        code = packet.code if v5 else V311_CONNACK.get(Code(packet.code), 3)
        body = bytes([packet.session_present, code]) + props(packet.properties)
        return _packet(PacketType.CONNACK, 0, body)
    if isinstance(packet, SubAck):
        codes = packet.codes if v5 else tuple(c if c < 0x80 else 0x80 for c in packet.codes)
        body = struct.pack("!H", packet.packet_id) + props(packet.properties) + bytes(codes)
        return _packet(PacketType.SUBACK, 0, body)
    if isinstance(packet, UnsubAck):
        body = struct.pack("!H", packet.packet_id) + (
            props(packet.properties) + bytes(packet.codes) if v5 else b""
        )
        return _packet(PacketType.UNSUBACK, 0, body)
    if isinstance(packet, PingResp):
        return _packet(PacketType.PINGRESP, 0, b"")
    if isinstance(packet, PingReq):
        return _packet(PacketType.PINGREQ, 0, b"")
    if isinstance(packet, Disconnect):
        body = bytes([packet.code]) + encode_properties(packet.properties) if v5 else b""
        return _packet(PacketType.DISCONNECT, 0, body)
    if isinstance(packet, Subscribe):
        body = struct.pack("!H", packet.packet_id) + props(packet.properties)
        body += b"".join(utf8(f) + bytes([options]) for f, options in packet.filters)
        return _packet(PacketType.SUBSCRIBE, 2, body)
    if isinstance(packet, Unsubscribe):
        body = struct.pack("!H", packet.packet_id) + props(packet.properties)
        return _packet(PacketType.UNSUBSCRIBE, 2, body + b"".join(utf8(f) for f in packet.filters))
    return _packet(PacketType.CONNECT, 0, _connect_body(packet))


def _connect_body(packet: Connect) -> bytes:
    v5 = packet.level == V5
    will = packet.will
    flags = packet.clean << 1
    if will is not None:
        flags |= 0x04 | will.qos << 3 | will.retain << 5
    flags |= (packet.password is not None) << 6 | (packet.username is not None) << 7
    body = utf8("MQTT") + bytes([packet.level, flags]) + struct.pack("!H", packet.keep_alive)
    if v5:
        body += encode_properties(packet.properties)
    body += utf8(packet.client_id)
    if will is not None:
        body += (encode_properties(will.properties) if v5 else b"") + utf8(will.topic) + binary(will.payload)
    if packet.username is not None:
        body += utf8(packet.username)
    if packet.password is not None:
        body += binary(packet.password)
    return body
