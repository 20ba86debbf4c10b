"""A node's direct path: the plain events of a read (a client's, a peer's over its link, another
cluster's over its gateway) routed in one C call (:mod:`meshplane.core.mesh.direct`), each copied into
the write buffers of the connections its route names, with no Python object per event; a NATS
client's PUBs and HPUBs without a reply subject too (``core/doors/_nats.c``: made into the node's
EVENT frames on the way, an HPUB's in the envelope the Python path makes).

It knows only routes the Python path has taken before and found plain: every local holder a client
connection, a NATS client with one subscription on the subject and no UNSUB max (its copy written as
a MSG line; any SUB or UNSUB forgets every route) or, for a client's event, another cluster's gateway,
and every peer's link up. A route is
learnt when the Python path routes such an event, and every learnt route is forgotten at once when
interest changes anywhere, when the dedup cache forgets a topic, or when one of its connections stops
being a plain target (a paused client, a client with events queued, a link down or near its buffer
limit): from then on its events take the Python path again until it is learnt anew. Counters come out
as the Python path would have kept them (``tests/unit/test_mesh_direct.py`` compares the two).

Clients' routes are kept per Message VPN: a VPN's subjects (``$vpn:NAME.`` ones) are checked by the
Python path once per route, for that VPN's clients, so a client cannot route another VPN's bytes
through a route learnt there. Users' permissions and VPNs' rates are checked per event: their clients
keep the Python path."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meshplane.core.doors.nats_protocol import MAX_CONTROL_LINE, native_route_pubs
from meshplane.core.doors.nats_subs import Subscription
from meshplane.core.mesh.direct import Entry, Target, native_route_events
from meshplane.core.mesh.frames import NODE_ID_BYTES
from meshplane.core.mesh.vpn import outward
from meshplane.core.subjects import MAX_SUBJECT_BYTES
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.doors.nats_client import NatsClient
from meshplane.mesh.gateways import GatewayHolder
from meshplane.mesh.holders import ClientSession
from meshplane.mesh.links import Link

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

BATCH_BYTES = 256 * 1024  # one call adds at most this much to a connection's write buffer


@dataclass(eq=False, slots=True)
class _Target:
    conn: FrameConnection | NatsClient
    buffer: bytearray = field(default_factory=bytearray)
    frames: int = 0


@dataclass(eq=False, slots=True)
class _Route:
    """What a run of one subject's events counts, where the Python path counts it per event."""

    subject: str
    targets: tuple[_Target, ...]
    links: tuple[Link, ...]  # peers it is forwarded to
    sessions: tuple[ClientSession, ...]
    gateways: tuple[Link, ...] = ()  # other clusters it is delivered to (their gateway holders)
    nats: tuple[Subscription, ...] = ()  # NATS clients' subscriptions it goes to as MSGs


class DirectPath:
    def __init__(self, node: MeshNode) -> None:
        self.node = node
        self.enabled = native_route_events is not None and "duplicate_events" not in node.config.faults
        # Clients' events, by VPN, then raw subject: a route is only taken by clients of the VPN whose
        # client's event the Python path found plain (another VPN's clients' bytes are never routed).
        self._sent: dict[str, dict[bytes, Entry]] = {}
        self._received: dict[bytes, Entry] = {}  # peers' events, by raw subject
        self._foreign: dict[bytes, Entry] = {}  # other clusters' events, by raw subject
        # NATS clients' PUBs, by VPN prefix, then raw subject: (route, mesh subject, buffers)
        self._doors: dict[str, dict[bytes, tuple[_Route, bytes, tuple[Target, ...]]]] = {}
        self._source = node.node_id.encode()[:NODE_ID_BYTES].ljust(NODE_ID_BYTES, b"\x00")
        self._targets: dict[FrameConnection | NatsClient, _Target] = {}
        self._links: dict[FrameConnection, Link] = {}
        self._sessions: dict[FrameConnection, ClientSession] = {}
        self._nats: set[NatsClient] = set()
        self._changes = -1
        self._forgotten = -1
        self.events = 0  # events it took (the tests and benchmarks read it)

    # --- reading: one call per read ------------------------------------------------------------------

    def client_reader(self, session: ClientSession) -> None:
        """Its plain events, stamped with its origin, on subjects learnt from its VPN's clients, take the
        direct path."""
        origin = session.origin.encode()
        if not self.enabled or len(origin) > NODE_ID_BYTES or origin.endswith(b"\x00"):
            return
        raw = origin.ljust(NODE_ID_BYTES, b"\x00")
        rates = self.node.logins  # a reload may give its VPN a rate: checked per event, in Python
        table = self._sent.setdefault(session.vpn, {})  # one per VPN: a reload's new VPNs add theirs
        session.conn.direct = lambda buffer, start: (
            self._read(session.conn, buffer, start, raw, None, table)
            if session.vpn not in rates.rates
            else start
        )

    def link_reader(self, link: Link, conn: FrameConnection, *, foreign: bool = False) -> None:
        """The events of ``link``'s connection (a gateway's: ``foreign``) take the direct path while it
        is the link's current one."""
        table = self._foreign if foreign else self._received
        if self.enabled:
            conn.direct = lambda buffer, start: (
                self._read(conn, buffer, start, None, link, table)
                if link.conn is conn and link.retiring is None and link.state == "up"
                else start
            )

    def _read(
        self,
        conn: FrameConnection,
        buffer: bytes,
        start: int,
        origin: bytes | None,
        link: Link | None,
        table: dict[bytes, Entry],
    ) -> int:
        node = self.node
        assert native_route_events is not None
        now = time.monotonic()
        if link is not None:
            node.dedup.expire(now)
        runs: list[tuple[_Route, int, int]] = []
        started = time.perf_counter()
        events = 0
        while table and self._usable():
            try:
                end = native_route_events(
                    buffer,
                    start,
                    conn.reader.max_payload,
                    MAX_SUBJECT_BYTES,
                    origin,
                    conn.reader.text,
                    table,
                    BATCH_BYTES,
                    link.peer if link is not None else None,
                    now,
                    runs,
                )
            finally:  # what was copied before an error (memory) is counted and sent all the same
                events += self._count(runs, link, now, table is self._foreign)
                runs.clear()
                self._write()
            if end == start:
                break
            start = end
        if events:
            conn.stats.frames_in += events
            self.events += events
            if node.on_latency is not None:
                node.on_latency((time.perf_counter() - started) / events)
        return start

    def door_read(
        self, prefix: str, buffer: bytearray, start: int, max_payload: int, headers: bool
    ) -> tuple[int, int]:
        """A NATS client's PUBs without a reply (HPUBs too, for a client that said ``headers`` in its
        CONNECT) at ``buffer[start:]`` on subjects learnt for its VPN (``prefix``), routed in C as the
        node's own events: (where it stopped, events taken)."""
        table = self._doors.get(prefix)
        if not table or native_route_pubs is None:
            return start, 0
        node = self.node
        now = time.monotonic()
        sequence = next(node._sequence)  # the node's numbers: its events' ids on the mesh
        events = 0
        try:
            while self._usable() and self._doors.get(prefix) is table:
                runs: list[tuple[_Route, int, int]] = []
                timestamp = time.time_ns() // 1_000_000
                try:
                    end = native_route_pubs(
                        buffer, start, max_payload, MAX_CONTROL_LINE, table, self._source,
                        sequence + events, timestamp, BATCH_BYTES, runs, headers,
                    )  # fmt: skip
                finally:
                    events += self._count(runs, None, now, False)
                    self._write()
                if end == start:
                    break
                start = end
        finally:
            node._sequence = itertools.count(sequence + events)
        self.events += events
        return start, events

    def door_sent(self, prefix: str, subject: str) -> None:
        """A NATS client's PUB or HPUB without a reply on ``subject`` (of the VPN with ``prefix``) took
        the Python path: learn its route (its event is the node's own, as a client's is its client's)."""
        if not self.enabled or native_route_pubs is None:
            return
        known = self._doors.get(prefix)
        if known is not None and subject.encode() in known and self._changes == self.node.router.changes:
            return
        learnt: dict[bytes, Entry] = {}
        # Not to its NATS clients: the publisher may be one that asked not to get its own (no_echo).
        self._learn(learnt, prefix + subject, gateways=True, peers=True, ids=False, nats=False)
        table = self._doors.setdefault(prefix, {})
        if len(table) >= self.node.config.router.route_cache_subjects:
            table.clear()
        for route_, _, buffers in learnt.values():
            table[subject.encode()] = (route_, (prefix + subject).encode(), buffers)

    def _usable(self) -> bool:
        """Forget every route once one of them may be stale; True while some remain."""
        node = self.node
        if (
            self._changes != node.router.changes
            or self._forgotten != node.dedup.forgotten
            or not all(link.conn is conn and self._plain_link(link) for conn, link in self._links.items())
            or not all(self._plain_session(session) for session in self._sessions.values())
            or not all(self._plain_nats(client) for client in self._nats)
        ):
            self.forget()
            return False
        return True

    def _count(
        self, runs: list[tuple[_Route, int, int]], link: Link | None, now: float, foreign: bool
    ) -> int:
        node = self.node
        total = 0
        for route, events, duplicates in runs:
            total += events
            delivered = events - duplicates
            for target in route.targets:
                target.frames += delivered
            for session in route.sessions:
                session.delivered += delivered
            for out in route.links:
                out.events_out += delivered
            for cluster in route.gateways:
                cluster.events_out += delivered
            for sub in route.nats:
                sub.delivered += delivered
            node.routed += delivered
            node.deliveries += delivered * len(route.targets)
            node.forwarded += delivered * len(route.links)
            if link is not None:
                link.events_in += events
                link.last_heard = now
                if duplicates:
                    link.counters["duplicates_in"] += duplicates
                if foreign and not route.targets:
                    link.counters["unwanted_in"] += delivered
                node.dedup.touch(route.subject, duplicates)
        return total

    def _write(self) -> None:
        for target in self._targets.values():
            if target.frames:
                data, frames = bytes(target.buffer), target.frames
                target.buffer.clear()
                target.frames = 0
                conn = target.conn
                conn.send(data)
                if isinstance(conn, NatsClient):
                    conn.msgs_out += frames
                else:
                    conn.stats.frames_out += frames - 1

    # --- learning and forgetting routes --------------------------------------------------------------

    def sent(self, vpn: str, subject: str) -> None:
        """A plain event of a client of ``vpn`` on ``subject`` (its VPN's prefix on) took the Python path:
        learn its route, for that VPN's clients only, if it is plain."""
        table = self._sent.get(vpn)
        if table is not None:
            self._learn(table, subject, gateways=True, peers=True, ids=False)

    def received(self, subject: str) -> None:
        """A peer's plain event on ``subject`` was delivered by the Python path (to every local holder,
        other clusters' gateways too): learn its route."""
        self._learn(self._received, subject, gateways=True, peers=False, ids=True)

    def foreign(self, subject: str) -> None:
        """Another cluster's plain event took the Python path (to this cluster only: local holders but
        gateways, and peers): learn its route."""
        self._learn(self._foreign, subject, gateways=False, peers=True, ids=True)

    def _learn(
        self,
        table: dict[bytes, Entry],
        subject: str,
        *,
        gateways: bool,
        peers: bool,
        ids: bool,
        nats: bool = True,
    ) -> None:
        if not self.enabled:
            return
        node, key = self.node, subject.encode()
        self._fresh(table)
        if key in table:
            return
        seen = node.dedup.ids_of(subject) if ids else None
        route = node.router.route(subject)
        holders = [h for h in route.local if gateways or type(h) is not GatewayHolder]
        links = [node.links.get(peer) for peer in route.peers] if peers else []
        if (ids and seen is None) or (not peers and not holders):
            return
        sessions, clusters, clients, messages = [], [], [], []
        for holder in holders:
            if type(holder) is ClientSession and self._plain_session(holder):
                sessions.append(holder)
            elif type(holder) is GatewayHolder and self._plain_link(holder.link):
                clusters.append(holder.link)
            elif type(holder) is NatsClient and nats and self._plain_nats(holder):
                subs = holder.subs.matches(subject)
                if len(subs) != 1 or subs[0].max_msgs is not None:  # one MSG each, none to count down
                    return
                clients.append(holder)
                messages.append(
                    (
                        subs[0],
                        b"MSG %s %s " % (outward(holder.prefix, subject).encode(), subs[0].sid.encode()),
                    )
                )
            else:
                return
        plain = [link for link in links if link is not None and self._plain_link(link)]
        if len(plain) != len(links):
            return
        conns = [session.conn for session in sessions]
        for session in sessions:
            self._sessions[session.conn] = session
        for link in (*plain, *clusters):
            assert link.conn is not None  # a plain link's
            self._links[link.conn] = link
            conns.append(link.conn)
        targets = tuple(self._target(conn) for conn in conns)
        msg_targets = tuple(self._target(client) for client in clients)
        self._nats.update(clients)
        counted = tuple(sub for sub, _ in messages)
        route_ = _Route(
            subject, targets + msg_targets, tuple(plain), tuple(sessions), tuple(clusters), counted
        )
        buffers: tuple[Target, ...] = tuple(t.buffer for t in targets)
        buffers += tuple((t.buffer, line) for t, (_, line) in zip(msg_targets, messages, strict=True))
        table[key] = (route_, seen, buffers)

    def forget(self) -> None:
        # A VPN's table is emptied, not dropped (its clients' readers hold it), unless a reload removed
        # the VPN (its clients are closed).
        vpns = self.node.config.vpns
        for table in self._sent.values():
            table.clear()
        if any(vpn not in vpns for vpn in self._sent):
            self._sent = {vpn: table for vpn, table in self._sent.items() if vpn in vpns}
        self._received.clear()
        self._foreign.clear()
        self._doors.clear()
        self._targets.clear()
        self._links.clear()
        self._sessions.clear()
        self._nats.clear()
        self._changes = self.node.router.changes
        self._forgotten = self.node.dedup.forgotten

    def _fresh(self, table: dict[bytes, Entry]) -> None:
        """Routes learnt before a change are forgotten; past the route cache's size, all are."""
        stale = self._changes != self.node.router.changes or self._forgotten != self.node.dedup.forgotten
        if stale or len(table) >= self.node.config.router.route_cache_subjects:
            self.forget()

    def _target(self, conn: FrameConnection | NatsClient) -> _Target:
        target = self._targets.get(conn)
        if target is None:
            target = self._targets[conn] = _Target(conn)
        return target

    def _plain_session(self, session: ClientSession) -> bool:
        conn = session.conn
        return (
            conn.transport is not None
            and not conn.paused
            and not session.queue
            and session.client_id in self.node.clients.sessions
        )

    def _plain_nats(self, client: NatsClient) -> bool:
        return client.connected and not client.closed and not client.checking and client.transport is not None

    def _plain_link(self, link: Link) -> bool:
        conn = link.conn
        return (
            link.state == "up"
            and conn is not None
            and conn.is_open
            and conn.buffered_bytes() + BATCH_BYTES <= self.node.config.link_buffer_bytes
        )
