"""One filter a client of the MQTT door subscribes to: mapped to a mesh pattern, checked against its
permissions and bounds (per connection, per persistent session, the node's), and taken. A shared
subscription (``$share/G/filter``) joins the door's queue group ``G`` on the filter's pattern: one
member of the group, on whatever node, gets each message (:mod:`.nats_groups`, as NATS queue groups)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_packets import V5, Code, MqttError
from meshplane.core.doors.mqtt_topics import RETAIN_PREFIX, BadTopic, matches, shared, to_pattern
from meshplane.core.doors.nats_groups import MQTT_MARK, marker
from meshplane.core.subjects import MAX_SUBJECT_BYTES, fits
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
    try:
        share = shared(topic_filter)
        pattern = check_fits(conn.prefix, to_pattern(topic_filter if share is None else share[1]))
    except BadTopic as exc:
        conn.door.count("bad_filter")
        log.info("MQTT client %s: filter refused: %s", bounded(conn.client_id), exc)
        return Code.BAD_TOPIC_FILTER, ""
    if conn.permissions is not None and conn.permissions.why_not_subscribe(pattern):
        conn.door.violation(conn)
        return Code.NOT_AUTHORIZED, ""
    qos = min(options & 3, 1)  # QoS 2 granted as 1
    if share is not None:
        return _take_shared(conn, topic_filter, share[0], pattern, options), ""
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
        if len(conn.subscriptions) + len(conn.shared) >= MAX_SUBSCRIPTIONS:
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


def _take_shared(conn: MqttConnection, topic_filter: str, group: str, pattern: str, options: int) -> int:
    if options & 4 and conn.level == V5:  # MQTT 5 section 3.8.3.1
        raise MqttError("protocol_error", "No Local on a shared subscription", Code.PROTOCOL_ERROR)
    if not fits(marker(group, conn.prefix + pattern, MQTT_MARK)):  # with what the mesh adds
        conn.door.count("bad_filter")
        return Code.BAD_TOPIC_FILTER
    qos = min(options & 3, 1)
    known = conn.shared.get(topic_filter)
    if known is not None:
        conn.shared[topic_filter] = (known[0], qos)
        return qos
    if len(conn.subscriptions) + len(conn.shared) >= MAX_SUBSCRIPTIONS:
        conn.door.count("subscription_limit")
        return Code.QUOTA_EXCEEDED
    if not conn.door.subscription_room(conn, topic_filter):
        return Code.QUOTA_EXCEEDED
    conn.door.node.logins.subscriptions[conn.vpn] += 1
    conn.shared[topic_filter] = (conn.door.groups.join(conn, topic_filter, group, conn.prefix + pattern), qos)
    return qos


def leave_shared(conn: MqttConnection, topic_filter: str) -> bool:
    """``conn`` leaves the group of its shared filter; whether it had one."""
    known = conn.shared.pop(topic_filter, None)
    if known is None:
        return False
    conn.door.node.logins.subscriptions[conn.vpn] -= 1
    conn.door.groups.leave(conn, topic_filter, known[0])
    return True


def drop_pattern(conn: MqttConnection, pattern: str) -> None:
    """One filter mapped to ``pattern`` went; the interest goes with the last."""
    left = conn.patterns.get(pattern, 0) - 1
    if left > 0:
        conn.patterns[pattern] = left
    else:
        conn.patterns.pop(pattern, None)
        conn.door.unsubscribed(conn, pattern)


def changed(conn: MqttConnection, save: bool = True) -> str:
    """The subscriptions changed: a persistent session saves them; why not, if they were not."""
    qos = {s.qos for s in conn.subscriptions.values()}
    conn.one_qos = qos.pop() if len(qos) == 1 else None
    conn.no_local = any(s.options & 4 for s in conn.subscriptions.values())
    if conn.session is not None and save:
        return conn.door.session_subscriptions(conn)
    return ""


def restore(conn: MqttConnection, subscriptions: dict[str, tuple[int, int]]) -> None:
    """A persistent session's subscriptions, taken again as they were granted."""
    for topic_filter, (qos, options) in subscriptions.items():
        take_filter(conn, topic_filter, options & ~3 | qos)
    changed(conn, save=False)


def all_no_local(conn: MqttConnection, subject: str) -> bool:
    """Whether every filter of ``conn`` matching ``subject`` asked for No Local."""
    found = [s for s in conn.subscriptions.values() if matches(s.pattern, subject)]
    return bool(found) and all(s.options & 4 for s in found)


def qos_for(conn: MqttConnection, subject: str) -> int:
    """The best QoS of ``conn``'s filters matching ``subject``."""
    if conn.one_qos is not None:
        return conn.one_qos
    return max((s.qos for s in conn.subscriptions.values() if matches(s.pattern, subject)), default=0)
