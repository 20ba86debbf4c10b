"""A node's mesh clients (the event plane's ``mesh`` transport): sessions, what they send, and the
pings that wait for every linked peer."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING

from meshplane.core.backpressure import SubscriberQueue
from meshplane.core.mesh.frames import (
    ACKS_PER_FRAME,
    FLAG_GUARANTEED,
    FLAG_PROPAGATED,
    Frame,
    FrameType,
    encode_batched_ack,
    encode_frame,
    event_parts,
)
from meshplane.core.mesh.vpn import DEFAULT, in_vpn, outward, prefix_of
from meshplane.core.subjects import RESERVED, is_reserved, valid_pattern
from meshplane.mesh.connection import close_peer
from meshplane.mesh.holders import ClientSession, MeshEvent
from meshplane.mesh.links import Handshake

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

log = logging.getLogger(__name__)

# Client heartbeats sent in one turn of the loop; more clients' are spread over the interval. All at
# once, 2,000 clients' heartbeats and their answers stalled the loop (every event behind them) for
# 0.2-0.35 s once a second (node and clients in one process); 64 at a time, for milliseconds.
HEARTBEAT_BURST = 64
# A client needs a heartbeat only to answer it, so that the node does not close it as idle: a quarter
# of the idle timeout apart, at most this far. Every heartbeat interval (1 s), 10,000 idle clients cost
# both ends a sealed frame each way 10,000 times a second, and on a loaded machine newcomers'
# handshakes passed the auth timeout (issue 60); nats-server pings its clients every 2 minutes.
CLIENT_HEARTBEAT_MAX = 30.0


class Clients:
    def __init__(self, node: MeshNode) -> None:
        self.node = node
        self.sessions: dict[str, ClientSession] = {}
        self._ids = itertools.count(1)
        self._pings = itertools.count(1)
        # token -> (client, its ping's sequence, peers still to answer, deadline)
        self._pending_pings: dict[int, tuple[ClientSession, int, set[str], float]] = {}
        self._pings_of: Counter[ClientSession] = Counter()
        idle = node.config.limits.idle_timeout
        self.heartbeat_every = min(idle / 4, CLIENT_HEARTBEAT_MAX) if idle else CLIENT_HEARTBEAT_MAX
        self._next_heartbeat = 0.0

    def peer_gone(self, peer: str) -> None:
        """A peer that is gone answers no ping."""
        for token in list(self._pending_pings):
            self.pong(peer, token)

    def resend_pings(self, peer: str) -> None:
        """``peer``'s link moved to another connection: the pings it has not answered go again there.
        When both ends dial at once, the peer ignores whatever came on the connection it did not keep
        (a ping sent there would wait for its expiry); a second answer to a ping is ignored."""
        link = self.node.links.get(peer)
        if link is None or link.conn is None:
            return
        for token, (_, _, waiting, _) in self._pending_pings.items():
            if peer in waiting:
                link.conn.send(encode_frame(FrameType.SYNC_REQ, self.node.node_id, sequence=token))

    def accept(self, state: Handshake) -> None:
        node = self.node
        client_id = f"c{next(self._ids)}"
        queue: SubscriberQueue[bytes] = SubscriberQueue(
            node.config.max_message_queue_size,
            node.config.max_message_queue_bytes,
            node.config.backpressure_policy,
        )
        vpn = (state.hello.vpn if state.hello is not None else "") or DEFAULT
        session = ClientSession(
            client_id,
            state.conn,
            queue,
            origin=state.origin,
            vpn=vpn,
            prefix=prefix_of(vpn),
            batched_acks=state.hello is not None and state.hello.batched_acks,
            on_overflow=self._overflowed,
        )
        session.answer = partial(self.answer, session)
        state.role, state.session = "client", session
        state.conn.peer = client_id
        self.sessions[client_id] = session
        node.logins.joined(session)
        if (
            not session.login_pending
            and not session.user  # one logged in by its certificate has permissions: checked per event
            and session.vpn not in node.logins.rates
        ):
            # A user's permissions, a VPN's rates, are checked per event: the Python path. Any VPN's
            # subjects are checked once per route (its clients' direct table has only those it passed).
            node.direct.client_reader(session)

    def _overflowed(self, session: ClientSession) -> None:
        node = self.node
        node.counters["clients_disconnected_slow"] += 1
        log.warning(
            "client %s disconnected: its queue is full (backpressure policy disconnect)", session.client_id
        )
        session.conn.close()

    def on_frame(self, session: ClientSession, frame: Frame) -> None:
        node = self.node
        kind = frame.type
        if session.login_pending:
            return node.logins.on_frame(session, frame)
        prefix = session.prefix
        if kind is FrameType.EVENT:
            # A VPN's client puts its VPN's prefix on its subjects itself (so its frames travel on as
            # they are); the node checks that it is its own, and that the rest is a client's subject.
            subject = frame.subject
            if prefix:  # in_vpn(), inline: this is every event's path
                valid = (
                    subject.startswith(prefix)
                    and not subject.startswith(RESERVED, len(prefix))
                    and node.valid_subject(subject)
                )
            else:
                valid = node.client_subject(subject)
            if not valid:
                node.frame_errors["bad_subject"] += 1
                if frame.flags & FLAG_GUARANTEED:
                    self.answer(
                        session, frame.sequence, f"subject {outward(prefix, subject)[:80]!r} is not valid"
                    )
                return
            if session.permissions is not None:
                external = subject[len(prefix) :]
                refused = session.permissions.why_not_publish(external)
                if refused:
                    if frame.flags & FLAG_GUARANTEED:
                        node.logins.violations[(session.vpn, session.user)] += 1
                        return self.answer(session, frame.sequence, refused)
                    return node.logins.violation(session, external, frame.sequence, refused)
            raw = frame.raw
            if session.vpn in node.logins.rates:
                limited = node.logins.publish_refused(session, len(raw))
                if limited:
                    if frame.flags & FLAG_GUARANTEED:
                        return self.answer(session, frame.sequence, limited)
                    return node.logins.tell_rate(session, subject[len(prefix) :], frame.sequence, limited)
            timestamp, body = event_parts(frame)
            if frame.flags & FLAG_GUARANTEED and frame.source != session.origin:
                node.frame_errors["foreign_origin"] += 1
                return self.answer(session, frame.sequence, "not this client's origin: connect again")
            if frame.flags & FLAG_GUARANTEED:  # stamps kept as they are: a resend keeps its event id
                event = MeshEvent(frame.source, subject, frame.sequence, timestamp, body, frame.flags, raw)
                sequence = frame.sequence
                try:
                    node.guaranteed.publish(event, session.answer, sequence, user=session.user)
                except Exception as exc:  # a failed store is an answer, never a dropped connection
                    node.counters["guaranteed_errors"] += 1
                    log.exception("a guaranteed publish on %r failed", frame.subject[:80])
                    self.answer(session, sequence, f"not stored: {exc}")
            elif frame.source == session.origin:  # stamped as agreed: passed on as it is
                node.route_direct(
                    MeshEvent(frame.source, subject, frame.sequence, timestamp, body, frame.flags, raw)
                )
                if not frame.flags and session.conn.direct is not None:  # learnt from its readers only
                    node.direct.sent(session.vpn, frame.subject)
            else:
                node.publish(subject[len(prefix) :], body, frame.flags, prefix=prefix)
        elif kind is FrameType.SUB_ADD:
            pattern = valid_pattern(frame.subject)  # with its VPN's prefix, as a subject
            if pattern is None or not (
                in_vpn(valid_pattern, prefix, pattern) if prefix else not is_reserved(pattern)
            ):
                node.frame_errors["bad_pattern"] += 1  # reserved: the node's queues, other VPNs
                return
            if node.router.count_of(session) >= node.config.max_patterns_per_client:
                node.frame_errors["client_pattern_limit"] += 1
                return
            external = pattern[len(prefix) :]
            refused = session.permissions.why_not_subscribe(external) if session.permissions else ""
            if refused:
                return node.logins.violation(session, external, 0, refused)
            if not node.router.holds(session, pattern):
                limited = node.logins.subscription_refused(session)
                if limited:
                    return node.logins.violation(session, external, 0, limited, counted=False)
                node.logins.subscribed(session, 1)
            node.subscribe(session, pattern)
        elif kind is FrameType.SUB_REMOVE:
            if node.router.holds(session, frame.subject):
                node.logins.subscribed(session, -1)
            node.unsubscribe(session, frame.subject)
        elif kind is FrameType.SYNC_REQ:  # a client's ping: everything before it has been handled ...
            peers = {peer for peer, link in node.links.items() if link.conn is not None}
            if frame.flags & FLAG_PROPAGATED and peers:  # ... here and, with this flag, at every peer
                if self._pings_of[session] >= node.config.limits.max_pings_per_client:
                    return close_peer(session.conn, "ping_limit")
                token = next(self._pings)
                deadline = time.monotonic() + node.config.limits.ping_timeout
                self._pending_pings[token] = (session, frame.sequence, peers, deadline)
                self._pings_of[session] += 1
                ping = encode_frame(FrameType.SYNC_REQ, node.node_id, sequence=token)
                for peer in peers:
                    conn = node.links[peer].conn
                    if conn is not None:
                        conn.send(ping)
            else:
                session.conn.send(encode_frame(FrameType.SYNC_RESP, node.node_id, sequence=frame.sequence))
        elif kind is not FrameType.HEARTBEAT:
            node.frame_errors["unexpected_client_frame"] += 1

    def answer(self, session: ClientSession, sequence: int, error: str) -> None:
        """A client's guaranteed EVENT: ACK once stored (a payload says why it was not). A client that
        takes batched ACKs gets one for all its events a commit stored, once the commit is done."""
        if not session.conn.is_open:
            return
        if error or not session.batched_acks:
            session.conn.send(
                encode_frame(FrameType.ACK, self.node.node_id, sequence=sequence, payload=error.encode())
            )
            return
        if not session.stored:
            asyncio.get_running_loop().call_soon(self._send_stored, session)
        session.stored.append(sequence)

    def _send_stored(self, session: ClientSession) -> None:
        stored, session.stored = session.stored, []
        if session.conn.is_open:
            for start in range(0, len(stored), ACKS_PER_FRAME):
                session.conn.send(
                    encode_batched_ack(self.node.node_id, stored[start : start + ACKS_PER_FRAME])
                )

    def pong(self, peer: str, token: int) -> None:
        """``peer`` has handled everything this node sent before ping ``token`` (or is gone)."""
        node = self.node
        pending = self._pending_pings.get(token)
        if pending is None:
            return
        session, client_sequence, waiting, _ = pending
        waiting.discard(peer)
        if not waiting:
            del self._pending_pings[token]
            if self._pings_of.get(session, 0) > 1:
                self._pings_of[session] -= 1
            else:
                self._pings_of.pop(session, None)
            if session.conn.is_open:
                session.conn.send(encode_frame(FrameType.SYNC_RESP, node.node_id, sequence=client_sequence))

    def heartbeat(self, frame: bytes, now: float) -> None:
        """Every ``heartbeat_every`` seconds, send every client ``frame``: ``HEARTBEAT_BURST`` at a
        time, the bursts spread over the interval (a client closed meanwhile is skipped)."""
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.heartbeat_every
        interval = self.heartbeat_every
        sessions = list(self.sessions.values())
        bursts = [sessions[i : i + HEARTBEAT_BURST] for i in range(0, len(sessions), HEARTBEAT_BURST)]
        for n, burst in enumerate(bursts):
            if n == 0:
                self._beat(frame, burst)
            else:
                asyncio.get_running_loop().call_later(n * interval / len(bursts), self._beat, frame, burst)

    def _beat(self, frame: bytes, sessions: list[ClientSession]) -> None:
        for session in sessions:
            if self.sessions.get(session.client_id) is session:
                session.conn.send(frame)

    def expire_pings(self, now: float) -> None:
        """A ping a peer has not answered in time is answered anyway (dicts keep their order: the
        oldest come first), so no client's pings pile up behind a peer that never reads."""
        expired = []
        for token, (_, _, waiting, deadline) in self._pending_pings.items():
            if deadline > now:
                break
            expired.append((token, set(waiting)))
        for token, waiting in expired:
            self.node.counters["pings_expired"] += 1
            for peer in waiting:
                self.pong(peer, token)

    def drop(self, session: ClientSession) -> None:
        node = self.node
        self.sessions.pop(session.client_id, None)
        self._pings_of.pop(session, None)  # its pings still waiting expire in their time
        node.counters["client_dropped_events"] += session.dropped
        patterns = node.router.patterns_of(session)
        node.logins.left(session, len(patterns))
        node.change_holdings(session, [(False, p) for p in patterns])
