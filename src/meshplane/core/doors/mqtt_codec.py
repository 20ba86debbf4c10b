"""Reading MQTT 3.1.1 and 5 from a client, sans I/O: bytes in, packets out (h11's shape).

:class:`MqttReader` cuts a byte stream into packets and decodes them, holding a server's rules: the
first packet is a CONNECT and there is no second; only what a client may send (no CONNACK, SUBACK...);
no QoS 2 (refused with 5's reason 0x9B, "QoS not supported": the door announces Maximum QoS 1 at
CONNACK to 5's clients, and grants 3.1.1's QoS 2 subscriptions as QoS 1); no topic aliases (the door
announces none) and no enhanced authentication (AUTH). A packet whose remaining length passes the
limit (``max_packet_size``, ``max_connect_size`` before CONNECT) is refused from its fixed header, its
body never buffered; a remaining length of more than four bytes is malformed. Every problem is one
:class:`MqttError`; after one, the reader takes nothing more (the connection is over).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, TypeAlias

from meshplane.core.compiled import compiled
from meshplane.core.doors.mqtt_packets import (
    NO_PROPERTIES,
    PROPERTY_TYPES,
    V5,
    V311,
    Code,
    Connect,
    Disconnect,
    MqttError,
    Packet,
    PacketType,
    PingReq,
    Prop,
    Properties,
    PubAck,
    Publish,
    Subscribe,
    Unsubscribe,
    Will,
)

_native = compiled("meshplane.core.doors._mqtt")
#: read_run(buffer, level, max_packet, out) -> offset (``_mqtt.c``; None where not built)
native_read_run: Callable[[bytearray, int, int, list[Any]], int] | None = (
    None if _native is None else _native.read_run
)
#: A plain PUBLISH read by the C path: (topic, payload, qos, retain, dup, packet_id)
PublishFields: TypeAlias = tuple[str, bytes, int, bool, bool, int]
#: What :meth:`MqttReader.feed_fast` returns: packets, plain PUBLISHes' fields, PUBACKs' identifiers
Item: TypeAlias = Packet | PublishFields | int

DEFAULT_MAX_PACKET = 1024 * 1024
DEFAULT_MAX_CONNECT = 64 * 1024  # what a connection not yet authenticated may make a node buffer
FROM_CLIENT = {
    PacketType.CONNECT,
    PacketType.PUBLISH,
    PacketType.PUBACK,
    PacketType.SUBSCRIBE,
    PacketType.UNSUBSCRIBE,
    PacketType.PINGREQ,
    PacketType.DISCONNECT,
}
FIXED_FLAGS = {PacketType.SUBSCRIBE: 2, PacketType.UNSUBSCRIBE: 2}  # else 0, but PUBLISH's


def malformed(detail: str, reason: str = "malformed") -> MqttError:
    return MqttError(reason, detail, Code.MALFORMED)


def protocol_error(detail: str, reason: str = "protocol_error") -> MqttError:
    return MqttError(reason, detail, Code.PROTOCOL_ERROR)


class Cursor:
    """A packet's body, read front to back; every read past its end is malformed."""

    __slots__ = ("at", "data")

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        end = self.at + size
        if end > len(self.data):
            raise malformed("a packet ends inside a field")
        chunk, self.at = self.data[self.at : end], end
        return chunk

    def byte(self) -> int:
        return self.take(1)[0]

    def two(self) -> int:
        value: int = struct.unpack("!H", self.take(2))[0]
        return value

    def four(self) -> int:
        value: int = struct.unpack("!I", self.take(4))[0]
        return value

    def varint(self) -> int:
        value = 0
        for shift in range(0, 28, 7):
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise malformed("a variable-length integer of more than four bytes")

    def binary(self) -> bytes:
        return self.take(self.two())

    def utf8(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise malformed("a string that is not UTF-8") from None
        if "\x00" in text:
            raise malformed("a string holding U+0000")
        return text

    def rest(self) -> bytes:
        chunk, self.at = self.data[self.at :], len(self.data)
        return chunk

    @property
    def left(self) -> int:
        return len(self.data) - self.at


def read_properties(cursor: Cursor) -> Properties:
    """An MQTT 5 property block; an unknown or (but user properties) repeated property is refused."""
    body = Cursor(cursor.take(cursor.varint()))
    found: dict[int, object] = {}
    pairs: list[tuple[str, str]] = []
    while body.left:
        key = body.varint()
        kind = PROPERTY_TYPES.get(key)
        if kind is None:
            raise malformed(f"unknown property {key:#x}")
        value: object
        if kind == "byte":
            value = body.byte()
        elif kind == "two":
            value = body.two()
        elif kind == "four":
            value = body.four()
        elif kind == "varint":
            value = body.varint()
        elif kind == "utf8":
            value = body.utf8()
        elif kind == "binary":
            value = body.binary()
        else:
            pairs.append((body.utf8(), body.utf8()))
            continue
        if key in found:
            raise protocol_error(f"property {key:#x} given twice")
        found[key] = value
    if pairs:
        found[Prop.USER_PROPERTY] = tuple(pairs)
    return MappingProxyType(found) if found else NO_PROPERTIES


def _properties(cursor: Cursor, level: int) -> Properties:
    return read_properties(cursor) if level == V5 else NO_PROPERTIES


def _qos(value: int, what: str) -> int:
    if value == 3:
        raise malformed(f"{what} with QoS 3")
    return value


def decode_connect(body: bytes) -> Connect:
    cursor = Cursor(body)
    name = cursor.utf8()
    level = cursor.byte()
    if name != "MQTT" or level not in (V311, V5):
        code = Code.UNSUPPORTED_VERSION if name in ("MQTT", "MQIsdp") else Code.PROTOCOL_ERROR
        raise MqttError(
            "unsupported_version",
            f"protocol {name[:20]!r} level {level}: this door speaks MQTT 3.1.1 (4) and 5",
            code,
            in_connect=True,
        )
    flags = cursor.byte()
    if flags & 0x01:
        raise MqttError("malformed", "CONNECT's reserved flag is set", in_connect=True)
    will_flag, will_qos, will_retain = flags & 0x04, (flags >> 3) & 3, bool(flags & 0x20)
    if not will_flag and (will_qos or will_retain):
        raise MqttError("malformed", "a will's QoS or retain without a will", in_connect=True)
    if will_qos == 3:
        raise MqttError("malformed", "a will with QoS 3", in_connect=True)
    has_password, has_user = flags & 0x40, flags & 0x80
    if level == V311 and has_password and not has_user:
        raise MqttError("malformed", "a password without a user name (3.1.1)", in_connect=True)
    keep_alive = cursor.two()
    properties = _properties(cursor, level)
    client_id = cursor.utf8()
    will = None
    if will_flag:
        will_properties = _properties(cursor, level)
        topic = cursor.utf8()
        will = Will(topic, cursor.binary(), will_qos, will_retain, will_properties)
    username = cursor.utf8() if has_user else None
    password = cursor.binary() if has_password else None
    if cursor.left:
        raise malformed("bytes after CONNECT's payload")
    return Connect(level, client_id, bool(flags & 0x02), keep_alive, username, password, will, properties)


def decode(kind: PacketType, flags: int, body: bytes, level: int) -> Packet:
    """One client packet's body (of a connection at ``level``)."""
    expected = FIXED_FLAGS.get(kind, 0)
    if kind is not PacketType.PUBLISH and flags != expected:
        raise malformed(f"{kind.name} with flags {flags:#x} (must be {expected:#x})")
    cursor = Cursor(body)
    packet: Packet
    if kind is PacketType.PUBLISH:
        qos, dup, retain = _qos((flags >> 1) & 3, "PUBLISH"), bool(flags & 8), bool(flags & 1)
        if dup and not qos:
            raise malformed("a QoS 0 PUBLISH marked DUP")
        topic = cursor.utf8()
        packet_id = cursor.two() if qos else 0
        if qos and not packet_id:
            raise malformed("a PUBLISH with packet identifier 0")
        properties = _properties(cursor, level)
        return Publish(topic, cursor.rest(), qos, retain, dup, packet_id, properties)
    if kind is PacketType.PUBACK:
        if len(body) == 2 and body != b"\0\0":  # the usual one, read without a cursor
            return PubAck(int.from_bytes(body, "big"))
        packet_id = cursor.two()
        code, properties = int(Code.SUCCESS), NO_PROPERTIES
        if level == V5 and cursor.left:
            code = cursor.byte()
            properties = read_properties(cursor) if cursor.left else NO_PROPERTIES
        packet = PubAck(packet_id, code, properties)
    elif kind is PacketType.SUBSCRIBE:
        packet_id = cursor.two()
        properties = _properties(cursor, level)
        filters = []
        while cursor.left:
            topic_filter, options = cursor.utf8(), cursor.byte()
            if options & (0xC0 if level == V5 else 0xFC) or (options >> 4) & 3 == 3:
                raise malformed(f"SUBSCRIBE options {options:#x} use reserved bits")
            _qos(options & 3, "a subscription")
            filters.append((topic_filter, options))
        if not filters:
            raise protocol_error("a SUBSCRIBE without a filter")
        packet = Subscribe(packet_id, tuple(filters), properties)
    elif kind is PacketType.UNSUBSCRIBE:
        packet_id = cursor.two()
        properties = _properties(cursor, level)
        names = []
        while cursor.left:
            names.append(cursor.utf8())
        if not names:
            raise protocol_error("an UNSUBSCRIBE without a filter")
        packet = Unsubscribe(packet_id, tuple(names), properties)
    elif kind is PacketType.PINGREQ:
        packet = PingReq()
    elif kind is PacketType.DISCONNECT:
        code, properties = int(Code.SUCCESS), NO_PROPERTIES
        if level == V5 and cursor.left:
            code = cursor.byte()
            properties = read_properties(cursor) if cursor.left else NO_PROPERTIES
        packet = Disconnect(code, properties)
    else:
        return decode_connect(body)
    if kind in (PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE, PacketType.PUBACK) and not packet.packet_id:  # type: ignore[union-attr]
        raise malformed(f"{kind.name} with packet identifier 0")
    if cursor.left:
        raise malformed(f"bytes after {kind.name}'s fields")
    return packet


_TYPES = (None, *(PacketType(n) for n in range(1, 16)))  # by number: an enum's call is slow


class MqttReader:
    """A server's side of one MQTT connection's incoming bytes: :meth:`feed` returns whole packets.

    ``level`` is 0 until the CONNECT, then the client's protocol level."""

    def __init__(
        self, max_packet_size: int = DEFAULT_MAX_PACKET, max_connect_size: int = DEFAULT_MAX_CONNECT
    ) -> None:
        self.max_packet_size = max_packet_size
        self.max_connect_size = max_connect_size
        self.level = 0
        self._buffer = bytearray()
        self.error: MqttError | None = None

    def feed(self, data: bytes) -> list[Packet]:
        """The packets ``data`` completes, in order; MqttError for the first that breaks a rule (when
        packets came before it in the same ``data``, they are returned, :attr:`error` is set, and the
        next call raises it). Never holds more than one packet's limit plus a fixed header."""
        if self.error is not None:
            raise self.error
        self._buffer += data
        packets: list[Packet] = []
        try:
            while True:
                packet = self._next()
                if packet is None:
                    return packets
                packets.append(packet)
        except MqttError as exc:
            self.error = exc
            self._buffer.clear()
            if not packets:
                raise
            return packets  # the packets before it count; the error comes at the next call

    def feed_fast(self, data: bytes) -> list[Item]:
        """:meth:`feed`, but a connected client's plain PUBLISHes come as their fields and its PUBACKs
        as their identifiers, read in C (``_mqtt.c``) where it is built: no object per packet. The
        packets C does not take are read by :meth:`feed` from where it stopped: the same packets and
        the same errors as :meth:`feed` alone."""
        if native_read_run is None or not self.level or self.error is not None:
            return [*self.feed(data)]
        buffer = self._buffer
        buffer += data
        items: list[Item] = []
        used = native_read_run(buffer, self.level, self.max_packet_size, items)
        del buffer[:used]
        if buffer:
            try:
                items += self.feed(b"")
            except MqttError:
                if not items:
                    raise
                # feed kept it as self.error: it comes at the next call, after these packets
        return items

    def _next(self) -> Packet | None:
        buffer = self._buffer
        if not buffer:
            return None
        length, shift, at = 0, 0, 1
        while True:
            if at >= len(buffer):
                if at > 4:
                    raise malformed("a remaining length of more than four bytes", "bad_length")
                return None
            byte = buffer[at]
            length |= (byte & 0x7F) << shift
            at += 1
            if not byte & 0x80:
                break
            shift += 7
            if at > 4:
                raise malformed("a remaining length of more than four bytes", "bad_length")
        first = buffer[0]
        kind_number, flags = first >> 4, first & 0x0F
        connected = self.level != 0
        limit = self.max_packet_size if connected else self.max_connect_size
        if at + length > limit:
            raise MqttError(
                "too_large",
                f"a packet of {at + length} bytes: this door takes {limit} at most",
                Code.PACKET_TOO_LARGE,
            )
        if kind_number == 0 or (kind := _TYPES[kind_number]) not in FROM_CLIENT:
            name = PacketType(kind_number).name if kind_number else "type 0"
            detail = {
                "PUBREC": "QoS 2 is not supported (at most QoS 1)",
                "PUBREL": "QoS 2 is not supported (at most QoS 1)",
                "PUBCOMP": "QoS 2 is not supported (at most QoS 1)",
                "AUTH": "enhanced authentication (AUTH) is not supported",
            }.get(name, "not a packet a client sends")
            raise protocol_error(f"{name}: {detail}", "unexpected_packet")
        if not connected and kind is not PacketType.CONNECT:
            raise protocol_error(
                f"{kind.name} before CONNECT: the first packet must be CONNECT", "no_connect"
            )
        if connected and kind is PacketType.CONNECT:
            raise protocol_error("a second CONNECT", "second_connect")
        if len(buffer) < at + length:
            return None
        body = bytes(buffer[at : at + length])
        del buffer[: at + length]
        if kind is PacketType.CONNECT:
            if flags:
                raise MqttError("malformed", "CONNECT with flags set", in_connect=True)
            connect = decode_connect(body)
            self.level = connect.level
            return connect
        packet = decode(kind, flags, body, self.level)
        if isinstance(packet, Publish):
            if packet.qos == 2:
                raise MqttError(
                    "qos2", "a QoS 2 PUBLISH: this door takes QoS 0 and 1", Code.QOS_NOT_SUPPORTED
                )
            if Prop.TOPIC_ALIAS in packet.properties:
                raise MqttError(
                    "topic_alias", "a topic alias: this door announces none", Code.TOPIC_ALIAS_INVALID
                )
        return packet
