"""A node's direct path: the plain events of a read (a client's, or a peer's over its link) routed in
one C call (:mod:`meshplane.core.mesh.direct`), each copied into the write buffers of the connections
its route names, with no Python object per event.

It knows only routes the Python path has taken before and found plain: a client's event whose every
local holder is a client connection and whose every peer's link is up, a peer's event whose every
local holder is a client connection. A route is learnt when the Python path delivers such an event,
and every learnt route is forgotten at once when interest changes anywhere, when the dedup cache
forgets a topic, or when one of its connections stops being a plain target (a paused client, a client
with events queued, a link down or near its buffer limit): from then on its events take the Python
path again until it is learnt anew. Counters come out as the Python path would have kept them."""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meshplane.core.mesh.direct import Entry, native_route_events
from meshplane.core.mesh.frames import NODE_ID_BYTES
from meshplane.core.subjects import MAX_SUBJECT_BYTES
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.holders import ClientSession
from meshplane.mesh.links import Link

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

BATCH_BYTES = 256 * 1024  # one call adds at most this much to a connection's write buffer


@dataclass(eq=False, slots=True)
class _Target:
    conn: FrameConnection
    buffer: bytearray = field(default_factory=bytearray)
    frames: int = 0


@dataclass(eq=False, slots=True)
class _Route:
    """What a run of one subject's events counts, where the Python path counts it per event."""

    subject: str
    targets: tuple[_Target, ...]
    links: tuple[Link, ...]
    sessions: tuple[ClientSession, ...]


class DirectPath:
    def __init__(self, node: MeshNode) -> None:
        self.node = node
        self.enabled = native_route_events is not None and "duplicate_events" not in node.config.faults
        self._sent: dict[bytes, Entry] = {}  # clients' events, by raw subject
        self._received: dict[bytes, Entry] = {}  # peers' events, by raw subject
        self._targets: dict[FrameConnection, _Target] = {}
        self._links: dict[FrameConnection, Link] = {}
        self._sessions: dict[FrameConnection, ClientSession] = {}
        self._changes = -1
        self._forgotten = -1
        self.events = 0  # routed here, for the status and the tests

    # --- reading: one call per read ------------------------------------------------------------------

    def client_reader(self, session: ClientSession) -> None:
        """Its plain events, stamped with its origin, take the direct path."""
        origin = session.origin.encode()
        if not self.enabled or len(origin) > NODE_ID_BYTES or origin.endswith(b"\x00"):
            return
        raw = origin.ljust(NODE_ID_BYTES, b"\x00")
        session.conn.direct = lambda buffer, start: self._read(session.conn, buffer, start, raw, None)

    def link_reader(self, link: Link, conn: FrameConnection) -> None:
        """The events of ``link``'s connection take the direct path while it is the link's current one."""
        if self.enabled:
            conn.direct = lambda buffer, start: (
                self._read(conn, buffer, start, None, link)
                if link.conn is conn and link.retiring is None and link.state == "up"
                else start
            )

    def _read(
        self, conn: FrameConnection, buffer: bytes, start: int, origin: bytes | None, link: Link | None
    ) -> int:
        node = self.node
        assert native_route_events is not None
        table = self._sent if link is None else self._received
        now = time.monotonic()
        if link is not None:
            node.dedup.expire(now)
        runs: list[tuple[_Route, int, int]] = []
        started = time.perf_counter()
        events = 0
        while table and self._usable():
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
                node.dedup.per_topic,
                runs,
            )
            events += self._count(runs, link, now)
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

    def _usable(self) -> bool:
        """Forget every route once one of them may be stale; True while some remain."""
        node = self.node
        if (
            self._changes != node.router.changes
            or self._forgotten != node.dedup.forgotten
            or not all(link.conn is conn and self._plain_link(link) for conn, link in self._links.items())
            or not all(self._plain_session(session) for session in self._sessions.values())
        ):
            self.forget()
            return False
        return True

    def _count(self, runs: list[tuple[_Route, int, int]], link: Link | None, now: float) -> int:
        node = self.node
        total = 0
        for route, events, duplicates in runs:
            total += events
            delivered = events - duplicates
            for target in route.targets:
                target.frames += delivered
            for session in route.sessions:
                session.delivered += delivered
            node.routed += delivered
            node.deliveries += delivered * len(route.targets)
            if link is None:
                for out in route.links:
                    out.events_out += events
                node.forwarded += events * len(route.links)
            else:
                link.events_in += events
                link.last_heard = now
                if duplicates:
                    link.counters["duplicates_in"] += duplicates
                node.dedup.touch(route.subject, duplicates)
        return total

    def _write(self) -> None:
        for target in self._targets.values():
            if target.frames:
                data, frames = bytes(target.buffer), target.frames
                target.buffer.clear()
                target.frames = 0
                target.conn.send(data)
                target.conn.stats.frames_out += frames - 1

    # --- learning and forgetting routes --------------------------------------------------------------

    def sent(self, subject: str) -> None:
        """A client's plain event on ``subject`` took the Python path: learn its route if it is plain."""
        node = self.node
        key = subject.encode()
        if not self.enabled or key in self._sent or not self._room(self._sent):
            return
        route = node.router.route(subject)
        links = tuple(node.links.get(peer) for peer in route.peers)
        sessions = self._plain_holders(route.local)
        if sessions is None or not all(link is not None and self._plain_link(link) for link in links):
            return
        plain = tuple(link for link in links if link is not None)
        targets = tuple(self._target(s.conn) for s in sessions)
        for link in plain:
            assert link.conn is not None  # a plain link's
            self._links[link.conn] = link
            targets += (self._target(link.conn),)
        self._sent[key] = (_Route(subject, targets, plain, sessions), None, tuple(t.buffer for t in targets))

    def received(self, subject: str) -> None:
        """A peer's event on ``subject`` was delivered by the Python path: learn its route if it is plain."""
        node = self.node
        key = subject.encode()
        if not self.enabled or key in self._received or not self._room(self._received):
            return
        ids = node.dedup.ids_of(subject)
        sessions = self._plain_holders(node.router.route(subject).local)
        if ids is None or not sessions:
            return
        targets = tuple(self._target(s.conn) for s in sessions)
        self._received[key] = (_Route(subject, targets, (), sessions), ids, tuple(t.buffer for t in targets))

    def forget(self) -> None:
        self._sent.clear()
        self._received.clear()
        self._targets.clear()
        self._links.clear()
        self._sessions.clear()
        self._changes = self.node.router.changes
        self._forgotten = self.node.dedup.forgotten

    def _room(self, table: dict[bytes, Entry]) -> bool:
        """Routes learnt before a change are forgotten first; past the route cache's size, all are."""
        stale = self._changes != self.node.router.changes or self._forgotten != self.node.dedup.forgotten
        if stale or len(table) >= self.node.config.router.route_cache_subjects:
            self.forget()
        return True

    def _plain_holders(self, holders: frozenset[Hashable]) -> tuple[ClientSession, ...] | None:
        sessions = []
        for holder in holders:
            if type(holder) is not ClientSession or not self._plain_session(holder):
                return None
            sessions.append(holder)
            self._sessions[holder.conn] = holder
        return tuple(sessions)

    def _target(self, conn: FrameConnection) -> _Target:
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

    def _plain_link(self, link: Link) -> bool:
        conn = link.conn
        return (
            link.state == "up"
            and conn is not None
            and conn.is_open
            and conn.buffered_bytes() + BATCH_BYTES <= self.node.config.link_buffer_bytes
        )
