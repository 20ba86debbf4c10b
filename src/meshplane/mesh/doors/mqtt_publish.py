"""What an MQTT client publishes, on a mesh node: QoS 0 as a direct event, QoS 1 as a guaranteed event
whose PUBACK goes once it is stored wherever it must be (the node's answer to a guaranteed publish), the
PUBACKs in the order of the PUBLISHes; a client's QoS 1 PUBLISHes being stored are bounded (reading
stops, or MQTT 5's Receive Maximum)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_expiry import expiry_headers
from meshplane.core.doors.mqtt_packets import (
    NO_PROPERTIES,
    V5,
    V311,
    Code,
    MqttError,
    Prop,
    Properties,
    PubAck,
    encode_puback,
)
from meshplane.core.doors.mqtt_topics import BadTopic
from meshplane.core.doors.nats_protocol import wrap
from meshplane.core.mesh.frames import ANSWER_UNKNOWN, FLAG_NATS_ENVELOPE
from meshplane.mesh.doors.mqtt_filters import all_no_local, check_fits

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt_connection import MqttConnection

RECEIVE_MAXIMUM = 1024  # QoS 1 PUBLISHes of a client waiting to be stored (5: announced at CONNACK)


@dataclass(slots=True)
class Pending:
    """A QoS 1 PUBLISH of the client being stored: its answer ("" stored), None until it comes."""

    packet_id: int
    error: str | None = None


def on_publish(
    conn: MqttConnection,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int,
    properties: Properties = NO_PROPERTIES,
) -> None:
    """A client's PUBLISH, as its fields (read in C or in Python); ``dup`` changes nothing."""
    try:
        subject = check_fits(conn.prefix, conn.door.subject_of(topic))
    except BadTopic as exc:
        conn.door.count("bad_topic")
        if qos and conn.level == V5:
            conn.send(PubAck(packet_id, Code.BAD_TOPIC_NAME, conn.reason(str(exc))))
            return
        raise MqttError("bad_topic", str(exc), Code.BAD_TOPIC_NAME) from None
    refused = conn.permissions.why_not_publish(subject) if conn.permissions is not None else ""
    if refused:
        conn.door.violation(conn)
        if qos:  # 3.1.1 has no refusing PUBACK: acknowledged and dropped (as mosquitto)
            conn.send(PubAck(packet_id, Code.NOT_AUTHORIZED, conn.reason(refused)))
        return
    logins = conn.door.node.logins
    if conn.vpn in logins.rates and (limited := logins.publish_refused(conn, len(payload))):
        conn.door.count("rate_refused")  # not published, retained or stored; a QoS 1 one answered
        if qos:  # in turn (3.1.1, which cannot refuse, closed unanswered: it comes again)
            conn.publishes.append(entry := Pending(packet_id))
            answered(conn, entry, 0, limited)
        return
    conn.messages_in += 1
    data, flags = payload, 0
    expiry = properties.get(Prop.MESSAGE_EXPIRY) if conn.level == V5 else None
    if isinstance(expiry, int):  # travels as its deadline (meshplane.core.doors.mqtt_expiry)
        deadline = time.time_ns() // 1_000_000 + expiry * 1000
        data, flags = wrap("", expiry_headers(deadline), payload), FLAG_NATS_ENVELOPE
    unstored = retain and conn.door.retain(conn.prefix + subject, payload, qos)
    if unstored and qos:  # not acknowledged, so not published either: the client sends it again
        conn.publishes.append(entry := Pending(packet_id))
        answered(conn, entry, 0, unstored)
        return
    skip = conn if conn.no_local and all_no_local(conn, conn.prefix + subject) else None
    if not qos:
        conn.door.node.publish(subject, data, flags, prefix=conn.prefix, skip=skip)
        return
    if len(conn.publishes) >= RECEIVE_MAXIMUM:
        raise MqttError(
            "receive_maximum",
            f"more than {RECEIVE_MAXIMUM} QoS 1 PUBLISHes unanswered",
            Code.RECEIVE_MAXIMUM_EXCEEDED,
        )
    entry = Pending(packet_id)
    conn.publishes.append(entry)
    if len(conn.publishes) >= RECEIVE_MAXIMUM // 2 and conn.transport is not None and conn.level == V311:
        conn.transport.pause_reading()  # 3.1.1 has no Receive Maximum: the socket waits
        conn.paused_reading = True
    answer = partial(answered, conn, entry)
    conn.door.publish_guaranteed(conn.prefix + subject, data, skip, answer, flags, conn.user)


def answered(conn: MqttConnection, entry: Pending, _: int, error: str) -> None:
    """A QoS 1 PUBLISH stored (``error`` empty) or not: PUBACKs go in order."""
    entry.error = error
    while conn.publishes and conn.publishes[0].error is not None:
        done = conn.publishes.popleft()
        packet_id, error = done.packet_id, done.error or ""
        if not error:
            conn.write(encode_puback(packet_id))
        elif conn.level == V5 and not error.startswith(ANSWER_UNKNOWN):
            conn.send(PubAck(packet_id, Code.UNSPECIFIED, conn.reason(f"not stored: {error}")))
        else:  # no PUBACK: the client sends it again when it reconnects (QoS 1: at least once)
            conn.door.count("not_stored")
            conn.close(Code.UNSPECIFIED, f"not stored: {error}")
            return
    if conn.paused_reading and len(conn.publishes) < RECEIVE_MAXIMUM // 4 and conn.transport is not None:
        conn.paused_reading = False
        if conn.saving is None:
            conn.release_held()  # what came in the same read after the PUBLISH that paused, then reading
