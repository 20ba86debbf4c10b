"""The MQTT door (``serve --mqtt-port``, over WebSocket ``--mqtt-ws-port``: :mod:`.mqtt_ws`): MQTT 3.1.1
and 5 clients, unchanged, on a mesh node.

Each connection (:mod:`.mqtt_connection`) is a holder of the node's interest, its topics mapped to the
mesh's subjects (:mod:`meshplane.core.doors.mqtt_topics`), so what it publishes reaches mesh clients,
pub/sub listeners, queues and the other nodes, and the other way round. Who it is:

- the user name ``USER@VPN`` (or ``USER``: the default VPN) of a Message VPN with users logs in as
  that user (the password checked against its argon2 hash, off the event loop, two at a time), and is
  held to its permissions and its VPN's limits;
- otherwise, with ``$MESHPLANE_MQTT_TOKEN`` set, the password must be that token (user name ``@VPN``
  or anything: the VPN named after ``@``, else the default);
- otherwise anyone may connect (as to a mesh node without secrets); a node whose mesh clients must
  prove a secret refuses to open an MQTT door without one of these.

A connection must send CONNECT within :data:`CONNECT_TIMEOUT` and then something every 1.5 keep-alive
intervals. Before its CONNECT it counts among the node's unproven connections (in all and per address).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshplane.core.doors.mqtt_codec import DEFAULT_MAX_PACKET
from meshplane.core.doors.mqtt_packets import V5, V311, Code, ConnAck, Connect, Prop
from meshplane.core.doors.mqtt_topics import BadTopic, to_subject
from meshplane.core.doors.nats_groups import MQTT_MARK
from meshplane.core.mesh.frames import FLAG_GUARANTEED
from meshplane.core.mesh.login_checks import WRONG
from meshplane.core.mesh.vpn import DEFAULT, outward, prefix_of
from meshplane.errors import ConfigError
from meshplane.mesh.doors.mqtt_connect import (
    MAX_CLIENT_ID,
    WillRefused,
    connack_properties,
    number,
    owner,
    will_of,
)
from meshplane.mesh.doors.mqtt_connection import MqttConnection
from meshplane.mesh.doors.mqtt_filters import check_fits, leave_shared, restore
from meshplane.mesh.doors.mqtt_retained import RetainedStore, RetainHolder
from meshplane.mesh.doors.mqtt_sessions import NEVER, Sessions, StoredSession, pump_queue
from meshplane.mesh.doors.mqtt_ws import MqttWebSocket, listen
from meshplane.mesh.doors.nats_groups import QueueGroups
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.links import Link
from meshplane.mesh.preauth import QuietLog, Unproven, bounded
from meshplane.streams.errors import StreamError

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

log = logging.getLogger(__name__)

TOKEN_ENV = "MESHPLANE_MQTT_TOKEN"
CONNECT_TIMEOUT = 5.0  # seconds from accept to CONNECT
CACHED_TOPICS = 4096  # topics whose subjects are kept at hand


class MqttDoor:
    def __init__(self, node: MeshNode, port: int | None, ws_port: int | None = None) -> None:
        self.node = node
        self.config_port = port  # None: WebSocket only
        self.ws = MqttWebSocket(self, ws_port, CONNECT_TIMEOUT) if ws_port is not None else None
        self.port = 0
        self.max_packet_size = DEFAULT_MAX_PACKET
        self.origin = "mqtt" + os.urandom(6).hex()  # the source id of what the door publishes
        self._sequence = itertools.count(1)
        self.connections: dict[tuple[str, str], MqttConnection] = {}  # connected, by (VPN, client id)
        self.unproven: Unproven[MqttConnection] = Unproven(
            node.config.limits.max_unauthenticated, node.config.limits.max_unauthenticated_per_address
        )
        self.counters: Counter[str] = Counter()
        self.quiet = QuietLog(log)
        self.retained = RetainedStore(vpns=lambda: len(node.config.vpns), origin=node.node_id)
        self.retain_holder = RetainHolder(self)
        self.groups = QueueGroups(node, self.counters, MQTT_MARK)  # shared subscriptions' groups
        self.sessions: Sessions | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self._token = os.environ.get(TOKEN_ENV, "")
        self._subjects: dict[str, str] = {}  # topic -> subject, bounded by CACHED_TOPICS
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        config = self.node.config
        has_users = any(vpn.users for vpn in config.vpns.values())
        if config.client_secret and not (has_users or self._token):
            raise ConfigError(
                f"--mqtt-port: this node's mesh clients must prove a secret; MQTT clients would prove "
                f"nothing. Set ${TOKEN_ENV} or give the VPNs users (--mesh-vpns)"
            )
        guaranteed = self.node.guaranteed
        if guaranteed.engine is not None:
            engine = guaranteed.engine
            self.retained.open(engine.root / "mesh", engine.durability.policy)  # before any link is up
            vpns = config.vpns
            self.sessions = Sessions(
                guaranteed.engine.root / "mesh",
                guaranteed.queues,
                lambda: len(vpns),
                config.mqtt_session_expiry,
            )
        self.retain_holder.hold()
        tls = config.tls.server_context() if config.tls is not None else None  # the node's, shared
        if self.config_port is not None:
            self._server = await listen(lambda: MqttConnection(self), config, self.config_port, tls)
            self.port = int(self._server.sockets[0].getsockname()[1])
            log.info("MQTT door on %s:%d", config.host, self.port)
        if self.ws is not None:
            await self.ws.start(tls)
        self._ticker = asyncio.create_task(self._ticks())

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections.values()):
            conn.close(Code.SERVER_UNAVAILABLE, "the node is shutting down")
        if self.ws is not None:
            await self.ws.close()
        for task in list(self.tasks):
            task.cancel()
        if self.sessions is not None:
            await self.sessions.close()
        self.retained.close()

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        for conn in list(self.connections.values()):
            if conn.keep_alive and now - conn.last_heard > 1.5 * conn.keep_alive:
                self.count("keep_alive_timeout")
                conn.close(Code.KEEP_ALIVE_TIMEOUT, "nothing heard for 1.5 keep-alive intervals")
        self.retained.tick()
        if self.sessions is not None:
            self.counters["sessions_expired"] += self.sessions.expire(self.sessions.now())
            self.sessions.checkpoint()

    def subject_of(self, topic: str) -> str:
        """A PUBLISH's topic as a subject (BadTopic if it has none), remembered: clients publish to
        few topics, and mapping one was a tenth of a QoS 1 PUBLISH's cost."""
        subject = self._subjects.get(topic)
        if subject is None:
            subject = to_subject(topic)
            if len(self._subjects) >= CACHED_TOPICS:
                self._subjects.clear()
            self._subjects[topic] = subject
        return subject

    def count(self, what: str) -> None:
        self.counters[what] += 1

    # --- connections -----------------------------------------------------------------------------

    def admit(self, conn: MqttConnection) -> bool:
        refused, oldest = self.unproven.admit(conn, conn.address)
        if refused:
            self.count(f"closed_{refused}")
            return False
        if oldest is not None:
            self.count("closed_unproven_evicted")
            oldest.close(abort=True)
        asyncio.get_running_loop().call_later(CONNECT_TIMEOUT, self._connect_deadline, conn)
        return True

    def _connect_deadline(self, conn: MqttConnection) -> None:
        # A CONNECT being answered (its password in the node's bounded queue of checks) is not late.
        if not conn.connected and not conn.level and not conn.closing:
            self.count("connect_timeout")
            conn.close(abort=True)

    async def connect(self, conn: MqttConnection, packet: Connect) -> None:
        """A CONNECT: who it is, its session, then CONNACK (or a refusal, and close)."""
        try:
            code, why = await self._admit_connect(conn, packet)
        except Exception as exc:  # a bug must not leave the client waiting
            log.exception("MQTT CONNECT failed")
            code, why = Code.UNSPECIFIED, f"internal error: {exc!r}"
        if conn.closing:
            return
        if code:
            self.count("connect_refused")
            log.info("refused an MQTT client %s: %s", bounded(packet.client_id), why)
            props: dict[int, object] = {Prop.REASON_STRING: why[:200]} if packet.level == V5 else {}
            conn.send(ConnAck(False, code, props))
            conn.end()
            return
        conn.release_held()

    async def _admit_connect(self, conn: MqttConnection, packet: Connect) -> tuple[int, str]:
        v5 = packet.level == V5
        client_id = packet.client_id
        if len(client_id) > MAX_CLIENT_ID:
            return Code.BAD_CLIENT_ID, f"a client id of more than {MAX_CLIENT_ID} characters"
        cap = self.node.config.mqtt_session_expiry
        asked = number(packet, Prop.SESSION_EXPIRY, 0) if v5 else (0 if packet.clean else NEVER)
        expiry = min(asked, cap)  # 3.1.1's sessions expire too, as mosquitto's persistent_client_expiration
        persistent = expiry > 0
        if not client_id:
            if packet.level == V311 and not packet.clean:
                return Code.BAD_CLIENT_ID, "a persistent session needs a client id"
            client_id = "mqtt-" + secrets.token_hex(8)
        try:
            will = will_of(packet)
        except WillRefused as exc:
            return exc.code, str(exc)
        code, why = await self._authenticate(conn, packet)
        if code:
            return code, why
        try:
            if will:
                check_fits(conn.prefix, will[0])  # the VPN's prefix is known now
        except BadTopic as exc:
            return Code.BAD_TOPIC_NAME, f"will: {exc}"
        refused = conn.permissions.why_not_publish(will[0]) if will and conn.permissions else ""
        if refused:
            self.violation(conn)
            return Code.NOT_AUTHORIZED, f"will: {refused}"
        vpn = self.node.config.vpns[conn.vpn]
        full = self.node.logins.connections_full(vpn)
        if full:
            return Code.QUOTA_EXCEEDED, full
        if len(self.connections) + len(self.node.clients.sessions) >= self.node.config.max_clients:
            self.count("client_limit")
            return Code.SERVER_BUSY, f"{self.node.config.max_clients} clients on this node (its limit)"
        if persistent and self.sessions is None:
            return Code.IMPLEMENTATION_SPECIFIC, "this node keeps no sessions (no streams data directory)"
        key = (conn.vpn, client_id)
        old = self.connections.get(key)
        stored = self.sessions.get(conn.vpn, client_id) if self.sessions is not None else None
        user = owner(conn)
        if (old is not None and owner(old) != user) or (stored is not None and stored.user != user):
            # A client id proves nothing: another user's session is neither resumed, ended nor cut.
            self.count("session_of_another_user")
            self.violation(conn)
            return Code.NOT_AUTHORIZED, f"client id {client_id[:64]!r} is another user's session"
        if old is not None:  # MQTT's rule: the new connection takes the session over
            self.count("session_taken_over")
            old.close(Code.SESSION_TAKEN_OVER, "another connection with this client id")
            self.gone(old)
        session_present = False
        if self.sessions is not None:
            if stored is not None and (packet.clean or not persistent):
                self.sessions.drop(conn.vpn, client_id)
                stored = None
            if persistent:
                if stored is None:
                    try:
                        stored = self.sessions.open(conn.vpn, client_id, expiry, user)
                    except StreamError as exc:
                        self.count("session_refused")
                        return Code.QUOTA_EXCEEDED, str(exc)
                else:
                    session_present = True
                stored.expiry, stored.left_at = expiry, 0.0
                conn.session = stored
        conn.client_id, conn.will, conn.keep_alive = client_id, will, packet.keep_alive
        if v5:
            conn.receive_maximum = min(number(packet, Prop.RECEIVE_MAXIMUM, 1000), 1000)
            conn.max_out_packet = number(packet, Prop.MAXIMUM_PACKET_SIZE, 0)
        self.unproven.done(conn)
        self.node.logins.connections[conn.vpn] += 1
        self.connections[key] = conn
        conn.connected = True
        self.count("connections")
        props = connack_properties(packet, client_id, expiry, asked, self.max_packet_size)
        conn.send(ConnAck(session_present, Code.SUCCESS, props))
        if conn.session is not None:
            self._restore(conn, conn.session)
        return 0, ""

    def reloaded(self, why_cut: Callable[[str, str], str]) -> int:
        """The node's VPNs were read again: the clients they no longer admit are cut, told why; each
        VPN's retained messages spread as the VPN now is."""
        self.retain_holder.hold()
        cut = 0
        for conn in list(self.connections.values()):
            reason = why_cut(conn.vpn, owner(conn))
            if reason:
                conn.close(Code.NOT_AUTHORIZED, reason)
                cut += 1
        return cut

    async def _authenticate(self, conn: MqttConnection, packet: Connect) -> tuple[int, str]:
        vpns = self.node.config.vpns
        username = packet.username or ""
        name, at, vpn = username.rpartition("@")
        if not at:
            name, vpn = username, DEFAULT
        if vpn not in vpns:
            return Code.BAD_USER_OR_PASSWORD, "wrong user or password"
        conn.vpn, conn.prefix = vpn, prefix_of(vpn)
        password = (packet.password or b"").decode("utf-8", "replace")
        users = vpns[vpn].users
        if users:  # in the node's fair, bounded queue of password checks, with the mesh's LOGINs
            user, why = await self.node.logins.authenticate(vpn, name, password, conn.address)
            if conn.closing:
                return Code.NOT_AUTHORIZED, "closed"
            if user is None:
                return (Code.BAD_USER_OR_PASSWORD if why == WRONG else Code.SERVER_BUSY), why
            conn.user, conn.permissions = name, user.permissions()
            return 0, ""
        if self._token and not hmac.compare_digest(password.encode(), self._token.encode()):
            self.node.logins.refused[vpn] += 1
            return Code.BAD_USER_OR_PASSWORD, "wrong user or password"
        conn.user = name
        return 0, ""

    def gone(self, conn: MqttConnection) -> None:
        """A connection closed (or was taken over): its interest goes, its will is published unless it
        said DISCONNECT, its session is kept (persistent) or forgotten."""
        self.unproven.done(conn)
        key = (conn.vpn, conn.client_id)
        if not conn.connected:
            return
        conn.connected = False
        if self.connections.get(key) is conn:
            del self.connections[key]
        self.node.logins.connections[conn.vpn] -= 1
        self.node.logins.subscriptions[conn.vpn] -= len(conn.patterns)
        for pattern in list(conn.patterns):
            self.node.unsubscribe(conn, pattern)
        for topic_filter in list(conn.shared):
            leave_shared(conn, topic_filter)
        if conn.pump is not None:
            conn.pump.cancel()
        if conn.will is not None and not conn.graceful:
            subject, payload, qos, retain = conn.will
            self.count("wills_published")
            if retain:
                self.retain(conn.prefix + subject, payload, qos)
            if qos:
                self.publish_guaranteed(conn.prefix + subject, payload, None, _will_answered, user=conn.user)
            else:
                self.node.publish(subject, payload, prefix=conn.prefix)
        if conn.session is not None and self.sessions is not None:
            conn.session.left_at = self.sessions.now()
            if conn.session.expiry == 0:
                self.sessions.drop(conn.vpn, conn.client_id)
            else:
                self.sessions.changed(conn.session)

    # --- the node ----------------------------------------------------------------------------------

    def subscribed(self, conn: MqttConnection, pattern: str) -> None:
        self.node.logins.subscriptions[conn.vpn] += 1
        self.node.subscribe(conn, pattern)

    def unsubscribed(self, conn: MqttConnection, pattern: str) -> None:
        self.node.logins.subscriptions[conn.vpn] -= 1
        self.node.unsubscribe(conn, pattern)

    def subscription_room(self, conn: MqttConnection, topic_filter: str) -> bool:
        """Whether ``conn`` may take one more filter: its VPN's limit, its session's bytes."""
        vpn = conn.vpn
        limit = self.node.config.vpns[vpn].max_subscriptions
        if limit is not None and self.node.logins.subscriptions[vpn] >= limit:
            self.node.logins.limits_refused[(vpn, "subscriptions")] += 1
            return False
        sessions = self.sessions
        if (
            conn.session is not None
            and sessions is not None
            and not sessions.room(conn.session, topic_filter)
        ):
            self.count("session_bytes_limit")
            return False
        return True

    def violation(self, conn: MqttConnection) -> None:
        self.node.logins.violations[(conn.vpn, conn.user)] += 1
        self.count("permission_denied")

    def publish_guaranteed(
        self,
        subject: str,
        payload: bytes,
        skip: MqttConnection | None,
        answered: Callable[[int, str], None],
        flags: int = 0,
        user: str = "",
    ) -> None:
        """A QoS 1 PUBLISH as a guaranteed event (``user``'s: its ``max_spool_bytes``); ``answered``."""
        now = time.time_ns() // 1_000_000
        event = MeshEvent(self.origin, subject, next(self._sequence), now, payload, FLAG_GUARANTEED | flags)
        self.node.guaranteed.publish(event, answered, skip=skip, user=user)

    def retain(self, subject: str, payload: bytes, qos: int) -> str:
        """See :meth:`RetainHolder.retain`."""
        return self.retain_holder.retain(subject, payload, qos)

    def link_up(self, link: Link) -> None:
        """A link (route or gateway) carries events now: the peer gets the retained messages held here."""
        self.retain_holder.catch_up(link)

    # --- persistent sessions -------------------------------------------------------------------------

    def sessions_dirty(self, session: StoredSession) -> None:
        if self.sessions is not None:
            self.sessions.changed(session)

    def session_subscriptions(self, conn: MqttConnection) -> str:
        """A persistent session's subscriptions changed: its queue's patterns follow, and they are
        being saved (``conn.saving``, fsynced in a worker thread); why not, when they could not be
        (the node's or its VPN's share of queues)."""
        session, sessions = conn.session, self.sessions
        if session is None or sessions is None:
            return ""
        before = session.subscriptions
        session.subscriptions = {f: (s.qos, s.options) for f, s in conn.subscriptions.items()}
        patterns = [outward(conn.prefix, s.pattern) for s in conn.subscriptions.values() if s.qos]
        try:
            conn.saving = sessions.subscriptions_changed(session, patterns, conn)
        except StreamError as exc:
            session.subscriptions = before  # as granted before: a QoS 1 filter without a queue gets nothing
            self.count("session_not_saved")
            log.warning("MQTT session %s: subscriptions not saved (%s)", bounded(conn.client_id), exc)
            return f"the session's subscriptions could not be saved: {exc}"
        self._start_pump(conn, session)
        return ""

    def _restore(self, conn: MqttConnection, session: StoredSession) -> None:
        conn.session = None  # what it was granted comes back as it was: no bound is applied again
        subscriptions = session.subscriptions
        refused = conn.permissions.why_not_queue("read", session.queue) if conn.permissions else ""
        if refused and any(qos for qos, _ in subscriptions.values()):
            # Its user may not read the session's queue (any more): what waits there stays there,
            # and its QoS 1 filters come back at QoS 0.
            self.violation(conn)
            log.info("MQTT client %s: %s: its subscriptions at QoS 0", bounded(conn.client_id), refused)
            subscriptions = {f: (0, options) for f, (_, options) in subscriptions.items()}
        restore(conn, subscriptions)
        conn.session = session
        session.sent = max(session.sent, session.acked)
        self._start_pump(conn, session)

    def _start_pump(self, conn: MqttConnection, session: StoredSession) -> None:
        if conn.pump is None and any(s.qos for s in conn.subscriptions.values()):
            engine = self.node.guaranteed.engine
            assert engine is not None  # a node without one keeps no sessions
            assert self.sessions is not None
            task = pump_queue(engine, conn, session, self.count, self.sessions)
            conn.pump = asyncio.get_running_loop().create_task(task)

    # --- what it looks like ------------------------------------------------------------------------

    def status(self, limit: int = 1000) -> dict[str, Any]:
        return {
            "port": self.port,
            "ws_port": self.ws.port if self.ws is not None else None,
            "clients": [_client(c) for c in itertools.islice(self.connections.values(), limit)],
            "sessions": len(self.sessions.by_key) if self.sessions is not None else 0,
            "sessions_bytes": self.sessions.bytes if self.sessions is not None else 0,
            "shared_subscriptions": self.groups.status(),
            "retained": self.retained.count,
            "retained_refused": dict(self.retained.refused),
            "retained_bytes": self.retained.total_bytes,
            "retained_learnt": dict(self.retained.learnt),
            "counters": dict(self.counters),
        }


def _client(conn: MqttConnection) -> dict[str, Any]:
    transport = conn.transport
    return {
        "client_id": conn.client_id,
        "address": conn.address,
        "protocol": "5" if conn.level == V5 else "3.1.1",
        "vpn": conn.vpn,
        "user": conn.user,
        "persistent": conn.session is not None,
        "subscriptions": len(conn.subscriptions),
        "messages_in": conn.messages_in,
        "messages_out": conn.messages_out,
        "inflight": len(conn.inflight),
        "waiting": len(conn.waiting),
        "buffered_bytes": transport.get_write_buffer_size() if transport is not None else 0,
    }


def _will_answered(_: int, error: str) -> None:
    if error:
        log.warning("a QoS 1 will was not stored: %s", error)
