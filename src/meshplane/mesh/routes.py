"""The node's routes: the links to the other nodes of its cluster. A connection that finished its
handshake becomes the link to its peer (one per pair of nodes: when both ends dialled, both keep the one
the smaller id dialled, and the retired one drains first); the frames that come over a link (interest,
anti-entropy, pings, events, guaranteed events); and what a link's end means."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from meshplane.core.mesh.frames import (
    Frame,
    FrameType,
    Hello,
    encode_frame,
    event_parts,
)
from meshplane.core.mesh.interest import encode_leaves
from meshplane.core.mesh.interest_frames import (
    Known,
    Refusal,
    interest_batch,
    interest_change,
    sync_answer,
    sync_reply,
)
from meshplane.mesh.connection import FrameConnection, close_peer
from meshplane.mesh.holders import MeshEvent, delivery_failed
from meshplane.mesh.links import Handshake, Link, peer_address

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

log = logging.getLogger("meshplane.mesh.node")

HELD_EVENTS = 10_000  # events of a new connection held while a retired one drains; then it waits unread


class Routes:
    def __init__(self, node: MeshNode) -> None:
        self.node = node

    def install(self, state: Handshake, hello: Hello) -> None:
        node = self.node
        peer, conn = hello.node, state.conn
        link = node.links.setdefault(peer, Link(peer))
        dialer = node.node_id if state.dialed else peer
        swapped = False
        if link.conn is not None and link.conn is not conn and link.conn.is_open:
            keep_new = dialer == min(node.node_id, peer) and link.dialed_by != dialer
            swapped = keep_new
            # Both ends apply the same rule and retire the same connection: each stops sending on
            # it and reads on until the other has too, so nothing sent before the switch is lost.
            loser = link.conn if keep_new else conn
            node.conns[loser].superseded = True
            node.conns[loser].role, node.conns[loser].peer, loser.peer = "route", peer, peer
            if keep_new and not loser.peer_done:
                link.retiring = loser  # events on the new connection wait for the old one's end
            loser.retire()
            if not keep_new:
                return
        state.role, state.peer, state.was_current = "route", peer, True
        conn.peer = peer
        if link.epoch and link.epoch != hello.epoch:
            node.counters["peer_restarts"] += 1
        same_process = link.epoch == hello.epoch
        link.conn, link.dialed_by, link.epoch = conn, dialer, hello.epoch
        link.interest_batches = hello.interest_batches and "no_interest_batches" not in node.config.faults
        node.direct.link_reader(link, conn)
        transport = conn.transport
        link.address = peer_address(transport)
        link.last_heard = time.monotonic()
        if not swapped:
            link.since = link.last_heard
        link.counters["connects"] += 1
        node.clients.resend_pings(peer)
        if swapped and same_process and link.state == "up":
            # Both ends dialled: the pair moves to the connection the smaller id dialled. The peer's
            # interest is still what it was, so the link keeps carrying events (a digest checks it).
            link.counters["connection_swaps"] += 1
            self.request_sync(link)
            return
        link.state = "syncing"
        # A new connection starts from what the peer confirmed: the old one may have died (its close
        # not yet seen here) with guaranteed events in flight.
        node.guaranteed.link_down(link)
        node.gateways.changed((), node.router.add_peer(peer))
        self.request_sync(link)
        log.info("link to %s (%s) up; learning its interest", peer, link.address)

    def request_sync(self, link: Link) -> None:
        node = self.node
        state = node.router.peers.get(link.peer)
        if link.conn is None or state is None:
            return
        link.sync_sent = time.monotonic()
        link.conn.send(
            encode_frame(FrameType.SYNC_REQ, node.node_id, payload=encode_leaves(state.interest.leaves()))
        )

    def on_eof(self, conn: FrameConnection) -> bool:
        """A link's connection the peer retired first: it will switch to the connection it dialled
        (or accepted) too. Keep sending here until then, but no longer than a dead peer would last."""
        node = self.node
        state = node.conns.get(conn)
        link = node.links.get(state.peer) if state is not None and state.role == "route" else None
        if link is not None and link.retiring is conn:
            self.release(link)
        if link is None or link.conn is not conn:
            return False
        asyncio.get_running_loop().call_later(node.config.dead_after, self._close_if_current, link, conn)
        return True

    @staticmethod
    def _close_if_current(link: Link, conn: FrameConnection) -> None:
        if link.conn is conn:
            conn.close()

    def closed(self, peer: str, conn: FrameConnection) -> None:
        """A connection of the route to ``peer`` closed: its counters kept; when it was the link's,
        the link is down (and forgotten if it never carried anything)."""
        node = self.node
        link = node.links.get(peer)
        if link is None:
            return
        for name in ("bytes_in", "bytes_out", "batches_out"):
            link.counters[name] += getattr(conn.stats, name)
        if link.retiring is conn:
            self.release(link)
        if link.conn is not conn:
            return
        link.conn, link.state, link.sync_sent = None, "down", None
        link.down.set()
        node.guaranteed.link_down(link)
        node.clients.peer_gone(peer)
        if node.running:
            log.warning("link to %s down", peer)
        if not link.was_up and peer not in node.guaranteed.spools:
            # It never carried anything: nothing to remember (a peer that links and leaves at once,
            # under ever new ids, must not leave a Link and a Bloom filter each behind).
            del node.links[peer]
            node.gateways.changed((), node.router.remove_peer(peer))

    def hold(self, link: Link, frame: Frame) -> None:
        link.held.append(frame)
        if len(link.held) >= HELD_EVENTS and link.conn is not None:
            # The old connection's last events are slow to come (its grace bounds the wait): the new
            # one is read no further, rather than hold more or deliver out of order.
            link.conn.hold()

    def release(self, link: Link) -> None:
        held, link.held, link.retiring = link.held, [], None
        for frame in held:
            self.on_frame(link, frame)
        if link.conn is not None:
            link.conn.release()

    def on_frame(self, link: Link, frame: Frame) -> None:
        node = self.node
        link.last_heard = now = time.monotonic()
        kind = frame.type
        if kind is FrameType.EVENT:
            self._on_event(link, frame, now)
        elif kind is FrameType.SPOOLED:
            node.guaranteed.on_spooled(link, frame)
        elif kind is FrameType.ACK:
            node.guaranteed.on_ack(link, frame)
        elif kind in (FrameType.SUB_ADD, FrameType.SUB_REMOVE):
            added = kind is FrameType.SUB_ADD
            link.counters["sub_add_in" if added else "sub_remove_in"] += 1
            if frame.source != link.peer:
                return self._count_bad(link, "foreign_origin")
            pattern = interest_change(frame, self._known(link), time.time_ns())
            if isinstance(pattern, Refusal):
                return self._refuse(link, pattern)
            if node.router.apply(link.peer, pattern, frame.sequence, added):
                gained, lost = ({pattern}, ()) if added else ((), {pattern})
                node.gateways.changed(gained, lost)
                node.guaranteed.learnt(link.peer, gained, lost)
        elif kind is FrameType.INTEREST:
            self._on_interest(link, frame)
        elif kind is FrameType.HEARTBEAT:
            state = node.router.peers.get(link.peer)
            stale = state is not None and frame.payload != state.interest.root()
            if link.state == "up" and link.sync_sent is None and stale:
                link.counters["resyncs"] += 1
                self.request_sync(link)
        elif kind is FrameType.SYNC_REQ:  # a ping is answered once all before it is
            reply = sync_reply(frame, node.node_id, node.router.own)
            if isinstance(reply, Refusal):
                return self._refuse(link, reply)
            if link.conn is not None:
                link.conn.send(reply)
        elif kind is FrameType.SYNC_RESP and not frame.payload:  # the answer to our ping
            node.clients.pong(link.peer, frame.sequence)
        elif kind is FrameType.SYNC_RESP:
            answer = sync_answer(frame.payload, self._known(link), time.time_ns())
            if isinstance(answer, Refusal):
                return self._refuse(link, answer)
            gained, lost = node.router.apply_sync(link.peer, answer)
            node.gateways.changed(gained, lost)
            node.guaranteed.learnt(link.peer, gained, lost)
            link.sync_sent = None
            if link.state == "syncing":
                link.state, link.was_up = "up", True
                link.down.clear()
                log.info("link to %s carries events", link.peer)
                node.guaranteed.link_up(link, node.router.peers[link.peer].interest.versions)
                if node.mqtt is not None:
                    node.mqtt.link_up(link)
        else:
            self._count_bad(link, "unexpected_hello")

    def _on_interest(self, link: Link, frame: Frame) -> None:
        """Many SUB_ADD / SUB_REMOVE in one frame: checked alike, applied in one go."""
        node = self.node
        link.counters["interest_frames_in"] += 1
        if frame.source != link.peer:
            return self._count_bad(link, "foreign_origin")
        state = node.router.peers.get(link.peer)
        held = state.interest.versions if state is not None else {}
        checked = interest_batch(frame.payload, self._known(link), held, time.time_ns())
        if isinstance(checked, Refusal):
            return self._refuse(link, checked)
        added = sum(change.added for change in checked.changes)
        link.counters["sub_add_in"] += added
        link.counters["sub_remove_in"] += len(checked.changes) - added
        for _ in range(checked.bad):
            self._count_bad(link, "bad_pattern")
        gained, lost = node.router.apply_many(link.peer, checked.changes)
        if gained or lost:
            node.gateways.changed(gained, lost)
            node.guaranteed.learnt(link.peer, gained, lost)

    def _known(self, link: Link) -> Known:
        state = self.node.router.peers.get(link.peer)
        interest = state.interest if state is not None else None
        limit = self.node.config.limits.max_patterns_per_peer
        return Known(
            interest.version if interest else 0, len(interest.versions) if interest else 0, link.epoch, limit
        )

    def _refuse(self, link: Link, refusal: Refusal) -> None:
        if refusal.close:
            close_peer(link.conn, refusal.reason)
        else:
            self._count_bad(link, refusal.reason)

    def _count_bad(self, link: Link, reason: str) -> None:
        link.counters["bad_frames"] += 1
        self.node.frame_errors[reason] += 1

    def _on_event(self, link: Link, frame: Frame, now: float) -> None:
        link.events_in += 1
        subject = frame.subject
        if not self.node.valid_subject(subject):
            return self._count_bad(link, "bad_subject")
        timestamp, body = event_parts(frame)
        event = MeshEvent(frame.source, subject, frame.sequence, timestamp, body, frame.flags, frame.raw)
        self.deliver_remote(link, event, now=now)
        if not frame.flags:
            self.node.direct.received(subject)

    def deliver_remote(
        self, link: Link, event: MeshEvent, *, quiet: bool = False, now: float | None = None
    ) -> None:
        """An event from a peer to this node's holders, once per event id; ``quiet``: a guaranteed
        event, which queues may want when nobody else does."""
        node = self.node
        holders = node.router.route(event.subject).local
        if not holders:  # nobody to deliver a copy to twice: no dedup either
            if not quiet:
                link.counters["unwanted_in"] += 1  # interest changed on the way, or a peer's stale copy
            return
        # The link is part of the id: a member that stamps another node's origin hides nothing of it.
        key = (event.timestamp_ms, event.sequence, event.source, link.peer)
        if node.dedup.seen(event.subject, key, time.monotonic() if now is None else now):
            link.counters["duplicates_in"] += 1
            return
        node.routed += 1
        node.deliveries += len(holders)
        for holder in holders:
            try:
                holder.deliver(event)
            except Exception as exc:  # one subscriber's failure is its own, not the link's
                delivery_failed(node.counters, node.quiet, holder, exc)
