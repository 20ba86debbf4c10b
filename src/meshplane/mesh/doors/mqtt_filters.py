"""One filter a client of the MQTT door subscribes to: mapped to a mesh pattern, checked against its
permissions and bounds (per connection, per persistent session, the node's), and taken."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_packets import V5, Code
from meshplane.core.doors.mqtt_topics import BadTopic, to_pattern
from meshplane.core.subjects import MAX_SUBJECT_BYTES, fits
from meshplane.mesh.doors.mqtt_retained import RETAIN_PREFIX
from meshplane.mesh.doors.mqtt_sessions import Subscription
from meshplane.mesh.preauth import bounded

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt_connection import MqttConnection

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS = 1000  # filters per connection
MAX_PERSISTENT_QOS1 = 100  # QoS 1 filters of a persistent session (its queue's patterns)


def check_fits(prefix: str, subject: str) -> str:
    """``subject`` (or a pattern) of a VPN with ``prefix``; BadTopic if the mesh cannot carry it: in
    front of it go the prefix and, for a retained message, ``$mqtt.``, and a frame's subject past
    MAX_SUBJECT_BYTES breaks the link it is sent on."""
    if not fits(RETAIN_PREFIX + prefix + subject):
        raise BadTopic(
            f"{len(subject.encode())} bytes: with what the mesh puts in front in this VPN, past "
            f"{MAX_SUBJECT_BYTES}"
        )
    return subject


def take_filter(conn: MqttConnection, topic_filter: str, options: int) -> tuple[int, str]:
    """One filter of a SUBSCRIBE (or of a session restored): its code (the QoS granted, or why not)
    and its mesh pattern; the connection's interest follows."""
    v5 = conn.level == V5
    if topic_filter.startswith("$share/") and v5:
        conn.door.count("shared_subscription")
        return Code.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, ""
    try:
        pattern = check_fits(conn.prefix, to_pattern(topic_filter))
    except BadTopic as exc:
        conn.door.count("bad_filter")
        log.info("MQTT client %s: filter refused: %s", bounded(conn.client_id), exc)
        return Code.BAD_TOPIC_FILTER, ""
    if conn.permissions is not None and conn.permissions.why_not_subscribe(pattern):
        conn.door.violation(conn)
        return Code.NOT_AUTHORIZED, ""
    qos = min(options & 3, 1)  # QoS 2 granted as 1
    if qos and conn.session is not None and conn.permissions is not None:
        # Its session's queue keeps it (made by it, bound to it, read by it): the user's queue
        # permissions decide, as for any queue.
        queued = conn.door.sessions is not None and conn.session.key in conn.door.sessions.queued
        for action in ("bind", "read") if queued else ("create", "bind", "read"):
            refused = conn.permissions.why_not_queue(action, conn.session.queue, (pattern,))
            if refused:
                conn.door.violation(conn)
                log.info("MQTT client %s: %s", bounded(conn.client_id), refused)
                return Code.NOT_AUTHORIZED, ""
    known = conn.subscriptions.get(topic_filter)
    if known is None:
        if len(conn.subscriptions) >= MAX_SUBSCRIPTIONS:
            conn.door.count("subscription_limit")
            return Code.QUOTA_EXCEEDED, ""
        if (
            conn.session is not None
            and qos
            and sum(s.qos for s in conn.subscriptions.values()) >= MAX_PERSISTENT_QOS1
        ):
            conn.door.count("subscription_limit")
            return Code.QUOTA_EXCEEDED, ""
        if not conn.door.subscription_room(conn, topic_filter):
            return Code.QUOTA_EXCEEDED, ""
    internal = conn.prefix + pattern
    conn.subscriptions[topic_filter] = Subscription(internal, qos, options)
    if known is None:
        conn.patterns[internal] = conn.patterns.get(internal, 0) + 1
        if conn.patterns[internal] == 1:
            conn.door.subscribed(conn, internal)
    return qos, internal
