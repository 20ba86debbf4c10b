"""A mesh node: links to every other node of its cluster, its clients' aggregated interest
advertised over them, and each event sent once over each link whose peer wants it (seeds 002, 004).

Data flows only from the node a publisher is on to the nodes its subscribers are on: a node never
forwards an event it received from a peer, so there are no loops by construction. Direct events are
at-most-once: one meant for a peer whose link is down is dropped, counted on that link.

Links: both ends of a route may dial; when two connections join the same pair of nodes, both ends
keep the one dialled by the smaller node id. Each new link starts by learning the peer's interest
afresh (SYNC_REQ with an empty digest); it carries events once the answer is in. Heartbeats carry
the sender's interest root: a copy that differs asks for the differing buckets (anti-entropy).

A node given ``--gateway`` links its cluster to others (:mod:`.gateways`); guaranteed events and
queues are in :mod:`.guaranteed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import ssl
import time
from collections import Counter
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, Literal

from meshplane.core.mesh.dedup import DedupCache
from meshplane.core.mesh.frames import (
    FLAG_GUARANTEED,
    Frame,
    FrameError,
    FrameType,
    encode_frame,
)
from meshplane.core.mesh.router import Router
from meshplane.core.subjects import SubjectCheck, is_reserved
from meshplane.mesh.clients import Clients
from meshplane.mesh.config import (
    CLIENT_SECRET_ENV,
    MEMBER_SECRET_ENV,
    SECRET_ENV,
    MeshConfig,
    parse_route,
)
from meshplane.mesh.connection import FrameConnection, PartialBytes
from meshplane.mesh.direct_path import DirectPath
from meshplane.mesh.doors.mqtt import MqttDoor
from meshplane.mesh.doors.nats import NatsDoor
from meshplane.mesh.gateways import GatewayHolder, Gateways
from meshplane.mesh.guaranteed import Guaranteed
from meshplane.mesh.handshakes import Handshakes
from meshplane.mesh.holders import Holder, MeshEvent, PubSubBridge, PubSubHolder, delivery_failed
from meshplane.mesh.imports import Imports
from meshplane.mesh.links import Handshake, Link, announce
from meshplane.mesh.logins import Logins
from meshplane.mesh.preauth import QuietLog
from meshplane.mesh.routes import Routes
from meshplane.mesh.status import node_status
from meshplane.streams.service import StreamsService

if TYPE_CHECKING:
    from meshplane.mesh.mates import MirrorServer

log = logging.getLogger(__name__)

SELF_RETRY = 30.0  # seconds between dials of an address that turned out to be this node itself


class MeshNode:
    """One node: started and closed around a streams server (``serve --node-id``), or on its own."""

    def __init__(self, config: MeshConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.epoch = time.time_ns()
        self.router: Router[Holder] = Router(config.router)
        self.links: dict[str, Link] = {}
        self.clients = Clients(self)
        self.imports = Imports(self)
        self.logins = Logins(self)
        self.routes = Routes(self)
        self.dedup = DedupCache(config.dedup_per_topic, config.dedup_ttl_secs, config.dedup_topics)
        self.direct = DirectPath(self)
        self.counters: Counter[str] = Counter()  # rare events, by name
        self.quiet = QuietLog(log)  # lines a flood would repeat: one a second per kind
        self.routed = self.forwarded = self.deliveries = 0  # per event: plain attributes, cheaper
        self.frame_errors: Counter[str] = Counter()
        self.route_port = 0
        self.on_latency: Any = None  # a callable taking seconds (the routing latency histogram)
        self._sequence = itertools.count(1)
        self.conns: dict[FrameConnection, Handshake] = {}  # every open connection, by its state
        self.valid_subject = SubjectCheck()
        self.client_subject = SubjectCheck(reserved=False)  # what a client may publish on
        self._duplicate_events = "duplicate_events" in config.faults
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.running = False
        self.gateways = Gateways(self)
        self.guaranteed = Guaranteed(self, config.spool)
        self.handshakes = Handshakes(self)
        self.mirror: MirrorServer | None = None  # with HA mates on other machines: the standby's feed
        self.mqtt = (
            MqttDoor(self, config.mqtt_port, config.mqtt_ws_port)
            if config.mqtt_port is not None or config.mqtt_ws_port is not None
            else None
        )
        self.partial = PartialBytes(config.limits.max_partial_bytes)
        self._server_tls = config.tls.server_context() if config.tls is not None else None
        self._client_tls = config.tls.client_context() if config.tls is not None else None
        self.nats = NatsDoor(self, config.nats_port) if config.nats_port is not None else None
        self.imports.configure(config.vpns)

    # --- lifecycle -----------------------------------------------------------------------------------

    @property
    def route_url(self) -> str:
        return f"tcp://{self.config.host}:{self.route_port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.running = True
        if self.config.one_secret:
            log.warning(
                "one mesh secret for members and clients (%s): any client could link as a node. Set "
                "%s and %s apart; the single secret is accepted for one more release",
                SECRET_ENV,
                MEMBER_SECRET_ENV,
                CLIENT_SECRET_ENV,
            )
        self.guaranteed.start()
        self._server = await loop.create_server(
            lambda: self._connection(dialed=False),
            self.config.host,
            self.config.route_port,
            reuse_address=True,
            ssl=self._server_tls,
            ssl_handshake_timeout=self.config.limits.auth_timeout if self._server_tls else None,
        )
        self.route_port = int(self._server.sockets[0].getsockname()[1])
        if self.mqtt is not None:
            await self.mqtt.start()
        self._tasks.append(asyncio.create_task(self._heartbeats()))
        for route in self.config.routes:
            self._tasks.append(asyncio.create_task(self._dial(route)))
        for address in self.gateways.dials():
            self._tasks.append(asyncio.create_task(self._dial(address, "gateway")))
        if self.nats is not None:
            await self.nats.start()

    async def close(self) -> None:
        self.running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.nats is not None:
            await self.nats.close()
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            conn.close()
        if self.mqtt is not None:
            await self.mqtt.close()
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()
        await self.guaranteed.close()

    def _connection(self, dialed: bool, role: Literal["route", "gateway"] = "route") -> FrameConnection:
        conn = FrameConnection(
            max_payload=self.config.max_payload,
            batch_size=self.config.message_batch_size,
            batch_timeout_ms=self.config.message_batch_timeout_ms,
            on_frame=self._on_frame,
            on_bad=self._on_bad_frame,
            on_close=self._on_close,
            on_open=self._on_open,
            on_resume=self._on_resume,
            on_eof=self.routes.on_eof,
            on_limit=self._on_limit,
            max_pending_bytes=self.config.limits.max_pending_bytes,
            partial=self.partial,
        )
        self.conns[conn] = Handshake(conn, dialed, dial_role=role)
        return conn

    def _on_open(self, conn: FrameConnection) -> None:
        self.handshakes.opened(self.conns[conn])

    def _on_limit(self, conn: FrameConnection, reason: str) -> None:
        self.counters[f"closed_{reason}"] += 1
        self.handshakes.quiet.warning(
            f"closed_{reason}",
            "closed the connection of %s: %s",
            conn.peer or "a new peer",
            reason.replace("_", " "),
        )

    # --- dialling ------------------------------------------------------------------------------------

    async def _dial(self, route: str, role: Literal["route", "gateway"] = "route") -> None:
        host, port = parse_route(route)
        loop = asyncio.get_running_loop()
        backoff = self.config.reconnect_min
        said_self = False
        while self.running:
            try:
                async with asyncio.timeout(self.config.handshake_timeout):
                    _, conn = await loop.create_connection(
                        lambda: self._connection(dialed=True, role=role),
                        host,
                        port,
                        ssl=self._client_tls,
                        server_hostname=host if self._client_tls else None,
                    )
            except (TimeoutError, OSError) as exc:
                if isinstance(exc, ssl.SSLError):
                    self.frame_errors["tls_handshake"] += 1
                    log.warning("route %s: TLS handshake failed: %s", route, exc)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(self.config.reconnect_max, backoff * 2)
                continue
            state = self.conns[conn]
            await conn.closed
            if state.error == "self":  # known from this process's own dial, never from the peer's word
                if not said_self:
                    log.info("route %s is this node itself: dialled only every %.0fs", route, SELF_RETRY)
                    said_self = True
                await asyncio.sleep(SELF_RETRY)
                continue
            peer = state.peer or (state.hello.node if state.hello is not None else "")
            link = self.links.get(peer)
            # Refused while this node has a live link to that peer: the pair kept the other connection.
            paired = state.superseded or (state.error == "refused" and state.hello is not None)
            if paired and link is not None and link.state != "down":
                await link.down.wait()  # the pair keeps the peer's connection; dial again once it is gone
            if state.role:
                backoff = self.config.reconnect_min
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(self.config.reconnect_max, backoff * 2)

    # --- frames --------------------------------------------------------------------------------------

    def _on_bad_frame(self, conn: FrameConnection, error: FrameError) -> None:
        self.frame_errors[error.reason] += 1
        state = self.conns.get(conn)
        if state is not None and state.role in ("route", "gateway"):
            links = self.links if state.role == "route" else self.gateways.links
            links[state.peer].counters["bad_frames"] += 1
        log.warning("dropped a frame from %s: %s", conn.peer or "a new connection", error.detail)

    def _on_frame(self, conn: FrameConnection, frame: Frame) -> None:
        state = self.conns[conn]
        if state.session is not None:  # the most frames: a client's events
            self.clients.on_frame(state.session, frame)
        elif state.role == "route":
            link = self.links[state.peer]
            if not state.was_current:  # the losing one of two connections: nothing on it applies
                self.frame_errors["not_current_connection"] += 1
                return
            if link.retiring is None or conn is not link.conn:
                self.routes.on_frame(link, frame)
            elif frame.type is FrameType.EVENT or frame.type is FrameType.SPOOLED:
                self.routes.hold(link, frame)  # the retired connection's last events come first
            else:
                self.routes.on_frame(link, frame)
        elif state.role == "gateway":
            self.gateways.on_frame(state.peer, frame)
        elif state.role == "mate" and self.mirror is not None:
            self.mirror.on_frame(conn, frame)
        else:
            self.handshakes.on_frame(state, frame)

    def _on_close(self, conn: FrameConnection) -> None:
        state = self.conns.pop(conn)
        self.handshakes.proven(state)
        if state.session is not None:
            self.clients.drop(state.session)
        if state.role == "gateway":
            self.gateways.on_close(state.peer, conn)
        if state.role == "route":
            self.routes.closed(state.peer, conn)
        if state.role == "mate" and self.mirror is not None:
            self.mirror.closed(conn)

    # --- clients -------------------------------------------------------------------------------------

    def _on_resume(self, conn: FrameConnection) -> None:
        state = self.conns.get(conn)
        if state is not None and state.session is not None:
            state.session.resume()
        elif state is not None and state.role == "route":
            self.guaranteed.pump(self.links.get(state.peer))
        elif state is not None and state.role == "gateway":
            self.guaranteed.pump(self.gateways.links.get(state.peer))

    # --- the node's API: interest and publishing -----------------------------------------------------

    def subscribe(self, holder: Holder, pattern: str) -> None:
        fresh = not self.router.holds(holder, pattern)
        version = self.router.subscribe(holder, pattern)
        if version is not None:
            self._announce(FrameType.SUB_ADD, pattern, version)
        if fresh and not isinstance(holder, GatewayHolder):  # what this cluster wants, for gateways
            self.gateways.changed({pattern}, ())
            if self.imports.active:
                self.imports.subscribed(holder, pattern)

    def unsubscribe(self, holder: Holder, pattern: str) -> None:
        held = self.router.holds(holder, pattern)
        version = self.router.unsubscribe(holder, pattern)
        if version is not None:
            self._announce(FrameType.SUB_REMOVE, pattern, version)
        if held and not isinstance(holder, GatewayHolder):
            self.gateways.changed((), {pattern})
            if self.imports.active:
                self.imports.unsubscribed(holder, pattern)

    def change_holdings(self, holder: Holder, changes: Iterable[tuple[bool, str]]) -> None:
        """:meth:`subscribe` (True) and :meth:`unsubscribe` of many patterns, in order, in one Router call
        (a gateway's frame of another cluster's changes, a leaving client's patterns)."""
        gained, lost, announced = self.router.change_holdings(holder, changes)
        for added, pattern, version in announced:
            self._announce(FrameType.SUB_ADD if added else FrameType.SUB_REMOVE, pattern, version)
        if (gained or lost) and not isinstance(holder, GatewayHolder):  # what this cluster wants
            self.gateways.changed(gained, lost)
            if self.imports.active:
                for pattern in gained:
                    self.imports.subscribed(holder, pattern)
                for pattern in lost:
                    self.imports.unsubscribed(holder, pattern)

    def _announce(self, kind: FrameType, pattern: str, version: int) -> None:
        if kind is FrameType.SUB_ADD and "drop_sub_add" in self.config.faults:
            return
        links = (link for link in self.links.values() if link.state != "down")
        announce(links, self.node_id, kind is FrameType.SUB_ADD, pattern, version)

    def publish(
        self, subject: str, body: bytes, flags: int = 0, *, skip: Holder | None = None, prefix: str = ""
    ) -> int:
        """Route an event published on this node: to its local holders (but ``skip``, which has
        delivered it already) and once over each link whose peer wants it. Returns the copies made.
        ``prefix``: the publisher's VPN's (:mod:`meshplane.core.mesh.vpn`)."""
        if is_reserved(subject):
            self.frame_errors["bad_subject"] += 1  # reserved subjects are the node's own
            return 0
        sequence = next(self._sequence)
        event = MeshEvent(self.node_id, prefix + subject, sequence, time.time_ns() // 1_000_000, body, flags)
        return self._route(event, skip)

    async def publish_guaranteed(
        self, subject: str, body: bytes, flags: int = 0, *, skip: Holder | None = None, user: str = ""
    ) -> None:
        """Publish a guaranteed event from this node: returns once it is stored wherever it must be
        (raises :class:`~meshplane.streams.errors.NotStored` when it was not); ``user``: its publisher
        logged in as this user of its VPN (held to the user's ``max_spool_bytes``)."""
        sequence = next(self._sequence)
        event = MeshEvent(
            self.node_id, subject, sequence, time.time_ns() // 1_000_000, body, flags | FLAG_GUARANTEED
        )
        await self.guaranteed.publish_async(event, skip, user)

    def route_direct(
        self, event: MeshEvent, exclude: Collection[str] = (), skip: Holder | None = None
    ) -> int:
        """An event's direct copies, as its origin made it: to local holders (but ``skip``) and once
        over each interested link (but those to ``exclude``, which a guaranteed event reaches spooled)."""
        return self._route(event, skip, exclude=exclude)

    def _route(
        self,
        event: MeshEvent,
        skip: Holder | None = None,
        *,
        foreign: bool = False,
        exclude: Collection[str] = (),
    ) -> int:
        """To local holders (but ``skip``; and, for an event from another cluster, but gateways) and
        once over each interested link (but those to ``exclude``)."""
        # The latency histogram samples one event in 64: observing every one cost more than routing.
        sampled = self.on_latency is not None and not event.sequence & 63
        started = time.perf_counter() if sampled else 0.0
        route = self.router.route(event.subject)
        copies = 0
        for holder in route.local:
            if holder is not skip and not (foreign and isinstance(holder, GatewayHolder)):
                try:
                    holder.deliver(event)
                except Exception as exc:  # one subscriber's failure is its own, not the publisher's
                    delivery_failed(self.counters, self.quiet, holder, exc)
                copies += 1
        for peer in route.peers:
            if peer not in exclude:
                copies += self._forward(self.links.get(peer), event)
        self.routed += 1
        self.deliveries += copies
        if sampled:
            self.on_latency(time.perf_counter() - started)
        return copies

    def route_foreign(self, event: MeshEvent, exclude: Collection[str] = ()) -> bool:
        """An event from another cluster: to this cluster only (local holders but gateways, and
        internal peers with interest, but those to ``exclude``). False when nobody here wanted it."""
        return self._route(event, foreign=True, exclude=exclude) > 0

    def _forward(self, link: Link | None, event: MeshEvent) -> int:
        if link is None:
            return 0
        if link.state != "up" or link.conn is None:
            link.counters["dropped_peer_down"] += 1
            return 0
        conn = link.conn
        if conn.buffered_bytes() > self.config.link_buffer_bytes:
            link.counters["dropped_backpressure"] += 1
            return 0
        conn.send(event.raw)
        if self._duplicate_events:
            conn.send(event.raw)
        link.events_out += 1
        self.forwarded += 1
        return 1

    # --- heartbeats, dead peers, anti-entropy --------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        heartbeat = encode_frame(
            FrameType.HEARTBEAT,
            self.node_id,
            sequence=self.router.own.version,
            payload=self.router.own.root(),
        )
        for link in self.links.values():
            if link.conn is None:
                continue
            if now - link.last_heard > self.config.dead_after:
                link.counters["dead_peer_timeouts"] += 1
                log.warning("no word from %s for %.1fs: closing the link", link.peer, now - link.last_heard)
                link.conn.close()
                continue
            link.conn.send(heartbeat)
            if link.sync_sent is not None and now - link.sync_sent > self.config.dead_after:
                self.routes.request_sync(link)  # the answer went missing
        self.clients.heartbeat(heartbeat, now)
        limits = self.config.limits
        for conn in list(self.conns):
            conn.check_deadlines(now, limits.frame_timeout, limits.idle_timeout)
        self.clients.expire_pings(now)
        self.gateways.tick(now)
        self.guaranteed.tick()

    # --- what it looks like --------------------------------------------------------------------------

    def status(self, patterns: bool = False, limit: int = 1000) -> dict[str, Any]:
        """What ``GET /mesh`` shows; with ``patterns``, this node's announced patterns and each peer's
        as this node knows them (at most ``limit`` of each, sorted)."""
        return node_status(self, patterns, limit)

    def forget(self, peer: str) -> dict[str, Any]:
        """Drop a departed node: its link, its interest, its spool and its remembered queues. A node
        whose link is up is refused (stop it first): it would only be learnt again."""
        link = self.links.get(peer)
        if link is not None and link.conn is not None:
            raise ValueError(f"node {peer!r} is linked: stop it before forgetting it")
        known = link is not None or peer in self.router.peers or peer in self.guaranteed.peer_queues
        dropped = self.guaranteed.forget(peer)
        if not known and not dropped["spooled_events_dropped"]:
            raise KeyError(peer)
        self.links.pop(peer, None)
        self.gateways.changed((), self.router.remove_peer(peer))
        self.counters["nodes_forgotten"] += 1
        log.warning("forgot node %s: %s", peer, dropped)
        return {"forgotten": peer, **dropped}

    def links_up(self) -> Iterable[str]:
        return (link.peer for link in self.links.values() if link.state == "up")

    # --- the pub/sub service of the node's streams server ---------------------------------------------

    def attach(self, engine: StreamsService) -> None:
        """Join a streams server: announce what its pub/sub service holds and route what is published
        there (see :class:`PubSubBridge`); keep spools and queues in its data directory. Call before
        :meth:`start`, so that the queues are advertised from the first link on."""
        self.guaranteed.open(engine)
        pubsub = engine.pubsub
        bridge = PubSubBridge(self, PubSubHolder(pubsub))
        pubsub.mesh = bridge
        for pattern in pubsub.patterns:
            bridge.interest(pattern, True)
