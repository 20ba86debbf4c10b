"""What the MQTT door makes of a CONNECT before it admits it: the will, numeric properties, who owns
the session, and the CONNACK's properties (MQTT 5 section 3.2.2.3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_packets import V5, Code, Connect, Prop
from meshplane.core.doors.mqtt_topics import BadTopic, to_subject
from meshplane.mesh.doors.mqtt_publish import RECEIVE_MAXIMUM

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt_connection import MqttConnection

MAX_CLIENT_ID = 256
Will = tuple[str, bytes, int, bool]  # subject, payload, QoS, retain


class WillRefused(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


def will_of(packet: Connect) -> Will | None:
    """The CONNECT's will as the door keeps it; WillRefused (with its CONNACK code) if it cannot be."""
    if packet.will is None:
        return None
    try:
        subject = to_subject(packet.will.topic)
    except BadTopic as exc:
        raise WillRefused(Code.BAD_TOPIC_NAME, f"will: {exc}") from None
    if packet.will.qos == 2 and packet.level == V5:
        raise WillRefused(Code.QOS_NOT_SUPPORTED, "a will of QoS 2: this door takes QoS 0 and 1")
    return (subject, packet.will.payload, min(packet.will.qos, 1), packet.will.retain)


def number(packet: Connect, key: int, default: int) -> int:
    value = packet.properties.get(key, default)
    return value if isinstance(value, int) else default


def owner(conn: MqttConnection) -> str:
    """The VPN user ``conn`` proved it is ("": none, a token's or an anonymous client)."""
    return conn.user if conn.permissions is not None else ""


def connack_properties(
    packet: Connect, client_id: str, expiry: int, asked: int, max_packet_size: int
) -> dict[int, object]:
    """What the door tells an MQTT 5 client it admits (3.1.1 has no properties)."""
    if packet.level != V5:
        return {}
    props: dict[int, object] = {
        Prop.MAXIMUM_QOS: 1,
        Prop.RETAIN_AVAILABLE: 1,
        Prop.MAXIMUM_PACKET_SIZE: max_packet_size,
        Prop.RECEIVE_MAXIMUM: RECEIVE_MAXIMUM,
        Prop.SHARED_AVAILABLE: 1,
        Prop.SUBSCRIPTION_ID_AVAILABLE: 0,
    }
    if client_id != packet.client_id:
        props[Prop.ASSIGNED_CLIENT_ID] = client_id
    if expiry != asked:
        props[Prop.SESSION_EXPIRY] = expiry  # the node's cap
    return props
