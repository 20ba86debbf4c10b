"""Guaranteed events (seed 002): stored before they are acknowledged, delivered exactly once, in order
per publisher, to the guaranteed subscriptions (queues) of every node, whatever node dies meanwhile.

- A **queue** (:mod:`.queues`) is a guaranteed subscription owned by one node. Its interest travels
  as the pattern under ``$G.`` (a reserved subject that wildcards do not reach), so the usual
  propagation, sync and anti-entropy carry it; a restarted node subscribes its queues before it
  links, so it re-advertises them first.
- On the **publishing node**, a guaranteed event is appended to a spool per destination node whose
  queues want it (:mod:`.spool`) and to this node's own queues; the publisher's ACK waits for the
  fsync policy. Spools are sent as SPOOLED frames while the link is up and kept while it is down.
  Which node's queues want what is kept apart from the routing table, and on disk (:mod:`.peer_queues`):
  the routing table forgets a peer's interest when the peer comes back (to learn it afresh), but events
  published meanwhile, or after this node restarts while that peer is down, must still be spooled for it.
- On the **destination**, the event goes to the direct subscribers at once and to the queues that
  want it (dropped there if that event id was stored already); ACK goes back once stored.
- **Across gateways** (seed 002's DMR): a cluster's queues' patterns cross each external link as
  ``$G.`` interest (:meth:`Guaranteed.cluster_learnt`), kept on disk by the gateway, whose cluster's
  nodes then spool for it. It spools what they send per other cluster (``mesh/cluster-spool``); the
  other gateway stores it as if published there, then confirms: one copy crosses, once, in order.

Writes are group-committed (what arrived while the last fsync ran shares the next one). Guaranteed
events also reach direct subscribers, as direct ones (at most once)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from collections import Counter
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplane.core.mesh.frames import (
    ANSWER_UNKNOWN,
    Frame,
    FrameType,
    decode_spooled,
    encode_frame,
    event_parts,
)
from meshplane.mesh.commit_batch import Answer, Work, store_batch
from meshplane.mesh.holders import Holder, MeshEvent
from meshplane.mesh.peer_queues import KnownQueues, learn_queues, queue_patterns
from meshplane.mesh.queue_items import Queue
from meshplane.mesh.queues import PREFIX, Queues
from meshplane.mesh.spool import (
    Spool,
    SpoolLimits,
    new_spool_offset,
    spool_directory,
    spool_peer,
    spool_table,
)
from meshplane.mesh.vpn_spool_room import VpnSpoolRoom
from meshplane.streams.errors import CorruptRecords, NotStored, OutcomeUnknown, StorageError
from meshplane.streams.files import changed

if TYPE_CHECKING:
    from meshplane.core.mesh.router import Route
    from meshplane.mesh.links import Link
    from meshplane.mesh.node import MeshNode
    from meshplane.streams.service import StreamsService

log = logging.getLogger(__name__)

MAX_WAITING = 200_000  # guaranteed events waiting for the next group commit, at most ...
MAX_WAITING_BYTES = 256 * 1024 * 1024  # ... and their bytes
CACHED_SUBJECTS = 4096  # subjects whose spools and queues are kept at hand
FSYNC_RETRY_SECS = 1.0  # a spool's failed fsync tried again after this (what it holds waits for it)


class Guaranteed:
    """A node's spools, queues and group commit; enabled once the node has a streams service."""

    def __init__(self, node: MeshNode, limits: SpoolLimits) -> None:
        self.node = node
        self.limits = limits
        self.engine: StreamsService | None = None
        self.spools: dict[str, Spool] = {}  # by peer
        self.cluster_spools: dict[str, Spool] = {}  # a gateway's, by other cluster
        self.vpn_room = VpnSpoolRoom(node, (self.spools, self.cluster_spools))
        self.queues = Queues(node)
        self.counters: Counter[str] = Counter()
        self._root = Path()
        self._work: list[Work] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed: set[Link] = set()  # links whose events failed to store: no ACK past the failure
        # Per link, failures so far: what a link sent before its last failure is not stored (its
        # queues would remember offsets past the one that failed, and drop it when it is resent).
        self._failures: Counter[Link] = Counter()
        self._acks: dict[Link, int] = {}  # link -> highest spool offset handled in this batch
        self._waiting_bytes = 0
        self._confirmers: dict[Link, Answer] = {}  # each link's answer to its SPOOLED frames (by offset)
        self._queues_of: dict[str, tuple[Route[Holder], list[Queue]]] = {}  # by subject
        # by subject: the peers and other clusters whose queues want it (as matched), and their spools
        self._spools_of: dict[str, tuple[frozenset[str], frozenset[str], list[Spool]]] = {}
        self.peers: KnownQueues | None = None  # each peer's queues
        self.clusters: KnownQueues | None = None  # each other cluster's queues (a gateway)

    @property
    def enabled(self) -> bool:
        return self.engine is not None

    # --- lifecycle -----------------------------------------------------------------------------------

    def open(self, engine: StreamsService) -> None:
        """Load the spools and the queues (subscribing them, so they are advertised from the start)."""
        self.engine = engine
        self._root = engine.root / "mesh"
        self.limits = dataclasses.replace(self.limits, sync_acked=engine.durability.policy != "never")
        for folder, spools in (("spool", self.spools), ("cluster-spool", self.cluster_spools)):
            (self._root / folder).mkdir(parents=True, exist_ok=True)
            for directory in sorted(p for p in (self._root / folder).iterdir() if p.is_dir()):
                peer = spool_peer(directory)
                if peer is not None:
                    spools[peer] = Spool(directory, peer, self.limits, engine.files)
        self.peers = KnownQueues(self._root, "peer_queues.log", self._peer_queues_changed)
        self.clusters = KnownQueues(self._root, "cluster_queues.log", self._cluster_queues_changed)
        self.queues.open(engine, self._root)
        self.peers.load()
        self.clusters.load()

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._commits(), name="meshplane-guaranteed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for work in self._work:
            work.done(work.ticket, "the node is shutting down")
        self._work.clear()
        for spool in (*self.spools.values(), *self.cluster_spools.values()):
            spool.close()
        for known in (self.peers, self.clusters):
            if known is not None:
                known.close()
        self.queues.close()

    def tick(self) -> None:
        for spool in (*self.spools.values(), *self.cluster_spools.values()):
            spool.save()
        if self.engine is not None:
            self.queues.save_marks()
        for known in (self.peers, self.clusters):
            if known is not None:
                known.sync()

    @property
    def peer_queues(self) -> dict[str, set[str]]:
        """Peer -> its queues' patterns (without the prefix)."""
        return self.peers.by_key if self.peers is not None else {}

    def forget(self, peer: str) -> dict[str, int]:
        """A departed node: its spool (with what it never confirmed) and its remembered queues go."""
        spool = self.spools.pop(peer, None)
        dropped = spool.pending if spool is not None else 0
        if spool is not None:
            spool.close()
            shutil.rmtree(spool.directory, ignore_errors=True)
            changed(spool.directory)
        forgotten = 0
        if self.peers is not None and (peer in self.peers.by_key or spool is not None):
            forgotten = self.peers.forget(peer)
        self._failed = {link for link in self._failed if link.external or link.peer != peer}
        self._confirmers = {k: c for k, c in self._confirmers.items() if k.external or k.peer != peer}
        self._spools_of.clear()
        return {"spooled_events_dropped": dropped, "queues_forgotten": forgotten}

    # --- queues --------------------------------------------------------------------------------------

    def spool_status(self, spools: dict[str, Spool] | None = None) -> list[dict[str, Any]]:
        """Each peer's spool (or, given ``cluster_spools``, each other cluster's)."""
        return spool_table((self.spools if spools is None else spools).values())

    # --- publishing: on the node the publisher is on --------------------------------------------------

    def publish(
        self, event: MeshEvent, done: Answer, ticket: int = 0, skip: Holder | None = None, user: str = ""
    ) -> None:
        """Route ``event`` (its flags say guaranteed) and call ``done(ticket, error)`` once it is stored
        everywhere it must be: the spool of each node whose queues want it, of each other cluster whose
        queues want it (a gateway), and this node's queues."""
        if self.peers is None or self.clusters is None:
            done(
                ticket, "this mesh node keeps no guaranteed events (it runs without a streams data directory)"
            )
            return
        subject = event.subject
        peers, clusters = self.peers.match(subject), self.clusters.match(subject)
        known = self._spools_of.get(subject)
        if known is not None and known[0] is peers and known[1] is clusters:  # the same matches: cached
            spools = known[2]
        else:
            spools = [self._spool(peer) for peer in sorted(peers)]
            spools += [self._cluster_spool(cluster) for cluster in sorted(clusters)]
            if len(self._spools_of) >= CACHED_SUBJECTS:
                self._spools_of.clear()
            self._spools_of[subject] = (peers, clusters, spools)
        # The spooled copy serves the direct subscribers of the peers it goes to.
        self.node.route_direct(event, peers, skip)
        self._submit(Work(event, spools, self._queues(event), done, ticket, user=user))

    def _queues(self, event: MeshEvent) -> list[Queue]:
        route = self.node.router.route(PREFIX + event.subject)
        known = self._queues_of.get(event.subject)
        if known is not None and known[0] is route:  # the router's cached route: still the same queues
            return known[1]
        if len(self._queues_of) >= CACHED_SUBJECTS:
            self._queues_of.clear()
        queues = self._queues_of[event.subject] = (route, [h for h in route.local if isinstance(h, Queue)])
        return queues[1]

    def cluster_wants(self, cluster: str, subject: str) -> bool:
        """Whether ``cluster``'s spool takes a guaranteed event on ``subject`` (then its direct copy
        does not cross too: the spooled one serves that cluster's direct subscribers)."""
        return self.clusters is not None and cluster in self.clusters.match(subject)

    async def publish_async(self, event: MeshEvent, skip: Holder | None = None, user: str = "") -> None:
        """:meth:`publish`, awaited: raises NotStored when it was not stored, OutcomeUnknown when it
        may or may not be."""
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def done(_: int, error: str) -> None:
            if not answer.done():
                answer.set_result(error)

        self.publish(event, done, skip=skip, user=user)
        error = await answer
        if error.startswith(ANSWER_UNKNOWN):
            raise OutcomeUnknown(error)
        if error:
            raise NotStored(error)

    def _spool(self, peer: str) -> Spool:
        return self._spool_in(self.spools, "spool", peer)

    def _cluster_spool(self, cluster: str) -> Spool:
        return self._spool_in(self.cluster_spools, "cluster-spool", cluster)

    def _spool_in(self, spools: dict[str, Spool], folder: str, key: str) -> Spool:
        spool = spools.get(key)
        if spool is None:
            assert self.engine is not None
            directory = spool_directory(self._root / folder, key)
            spool = spools[key] = Spool(directory, key, self.limits, self.engine.files, new_spool_offset())
        return spool

    def _link_of(self, spool: Spool) -> Link | None:
        if self.cluster_spools.get(spool.peer) is spool:
            return self.node.gateways.links.get(spool.peer)
        return self.node.links.get(spool.peer)

    # --- on the destination ----------------------------------------------------------------------------

    def on_spooled(self, link: Link, frame: Frame) -> None:
        """A SPOOLED frame from a peer, or (``link.external``) from another cluster's gateway."""
        offset = frame.sequence
        if link.spooled_next is not None and offset > link.spooled_next:
            # Offsets lost on the way (a retired connection closed unread): confirming this one would
            # confirm them too. The link starts over; the peer resends from what was confirmed.
            self.counters["spooled_gaps"] += 1
            log.warning("%s skipped spool offset %d: the link starts over", link.peer, link.spooled_next)
            if link.conn is not None:
                link.conn.close()
            return
        link.spooled_next = offset + 1  # a resend (a lower offset) is welcome

        done = self._confirmers.get(link) or self._confirmers.setdefault(link, partial(self._confirm, link))
        if self.peers is None or self.clusters is None:  # no queues here, ever: nothing to wait for
            self.counters["spooled_unwanted"] += 1
            self._confirm(link, offset, "")
            self._send_acks()
            return
        try:
            inner = decode_spooled(frame, self.node.config.max_payload)
            if not self.node.valid_subject(inner.subject):
                raise ValueError(f"subject {inner.subject[:80]!r}")
        except ValueError:
            # Nothing will make it better: confirmed (in its turn) and counted.
            self.counters["bad_spooled"] += 1
            self._submit(Work(None, [], [], done, offset))
            return
        timestamp, body = event_parts(inner)
        if link.external and not self.node.gateways.crosses(inner.subject):  # its VPN stays in its cluster
            self.counters["spooled_outside_dmr"] += 1
            self._submit(Work(None, [], [], done, offset))
            return
        if link.external:
            event = MeshEvent(inner.source, inner.subject, inner.sequence, timestamp, body, inner.flags)
            self._from_cluster(link, event, done, offset)
            return
        event = MeshEvent(
            inner.source, inner.subject, inner.sequence, timestamp, body, inner.flags, inner.raw
        )
        self.node.routes.deliver_remote(link, event, quiet=True)
        queues = self._queues(event)
        clusters = self.clusters.match(event.subject)  # a gateway passes it on, once per cluster
        if not queues and not clusters:
            self.counters["spooled_unwanted"] += 1  # the queue went away on the way
        spools = [self._cluster_spool(c) for c in sorted(clusters)] if clusters else []
        self._submit(Work(event, spools, queues, done, offset, link.peer, link, self._failures[link]))

    def _from_cluster(self, link: Link, event: MeshEvent, done: Answer, offset: int) -> None:
        """A guaranteed event another cluster's gateway sent: stored here as if published on this node
        (spools of the nodes whose queues want it, this node's queues), never sent on to a third
        cluster. Node ids are unique within a cluster only: the stored copy's origin is
        ``node@cluster``, so that queues tell apart the events of two clusters' same-named nodes."""
        assert self.peers is not None
        key = (event.timestamp_ms, event.sequence, event.source, link.peer)
        event = MeshEvent(
            f"{event.source}@{link.peer}",
            event.subject,
            event.sequence,
            event.timestamp_ms,
            event.body,
            event.flags,
        )
        peers = self.peers.match(event.subject)
        if self.node.dedup.seen(event.subject, key, time.monotonic()):
            link.counters["duplicates_in"] += 1  # a resend: stored again (queues drop it by id)
        else:
            self.node.route_foreign(event, exclude=peers)
        self._submit(
            Work(
                event,
                [self._spool(p) for p in sorted(peers)],
                self._queues(event),
                done,
                offset,
                f"@{link.peer}",
                link,
                self._failures[link],
            )
        )

    def _confirm(self, link: Link, offset: int, error: str) -> None:
        """One SPOOLED frame handled: confirmed (cumulatively, once per batch) unless it failed."""
        if link in self._failed or link.conn is None:
            return
        if error:
            # Confirming later ones would skip this one: the link starts over and the peer resends.
            self._failed.add(link)
            self._failures[link] += 1
            self._acks.pop(link, None)
            self.counters["store_failures"] += 1
            log.warning(
                "could not store guaranteed events from %s (%s): the link starts over", link.peer, error
            )
            link.conn.close()
            return
        self._acks[link] = offset  # frames are handled in order: the last is the highest

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, {}
        for link, offset in acks.items():
            if link.conn is not None:
                link.conn.send(encode_frame(FrameType.ACK, self.node.node_id, sequence=offset))

    def on_ack(self, link: Link, frame: Frame) -> None:
        spool = (self.cluster_spools if link.external else self.spools).get(link.peer)
        if spool is not None and spool.confirm(frame.sequence):
            self.pump(link)

    # --- links -----------------------------------------------------------------------------------------

    def learnt(self, peer: str, gained: Iterable[str], lost: Iterable[str]) -> None:
        """Interest a peer gained or lost: its queues' patterns are remembered apart."""
        learn_queues(self.peers, peer, gained, lost)

    def link_up(self, link: Link, interest: Iterable[str]) -> None:
        """The peer's (or other cluster's) interest is learnt afresh (``interest``): its queues are
        exactly those now."""
        known = self.clusters if link.external else self.peers
        if known is not None:
            known.replace(link.peer, queue_patterns(interest))
        self.pump(link)

    def cluster_learnt(self, cluster: str, gained: Iterable[str], lost: Iterable[str]) -> None:
        """Interest another cluster announced over its external link (a gateway)."""
        learn_queues(self.clusters, cluster, gained, lost)

    def _peer_queues_changed(self, peer: str, added: set[str], removed: set[str]) -> None:
        """What this cluster's queues want, as other clusters are told: each node's queues', once."""
        self.node.gateways.queues_changed(added, removed)

    def _cluster_queues_changed(self, cluster: str, added: set[str], removed: set[str]) -> None:
        """Held in the routing table, so that this cluster's nodes spool for this gateway."""
        holder = self.node.gateways.holder(cluster)
        for pattern in added:
            self.node.subscribe(holder, PREFIX + pattern)
        for pattern in removed:
            self.node.unsubscribe(holder, PREFIX + pattern)

    def link_down(self, link: Link) -> None:
        self._failed.discard(link)
        link.spooled_next = None  # the next connection starts where the peer's confirmations do
        spool = (self.cluster_spools if link.external else self.spools).get(link.peer)
        if spool is not None:
            spool.rewind()

    def pump(self, link: Link | None) -> None:
        """Send what the link's spool holds and it has not been sent, while the socket takes it."""
        if link is None or link.state != "up" or link.conn is None:
            return
        spool = (self.cluster_spools if link.external else self.spools).get(link.peer)
        if spool is None or "hold_spooled" in self.node.config.faults:
            return
        conn = link.conn
        while not conn.paused and conn.is_open:
            try:
                records = spool.to_send()
            except (StorageError, CorruptRecords) as exc:
                self.counters["spool_read_errors"] += 1
                log.error("spool for %s: cannot read at offset %d (%s)", link.peer, spool.sent, exc)
                return
            if not records:
                return
            node_id = self.node.node_id
            conn.send_many(
                [
                    encode_frame(FrameType.SPOOLED, node_id, sequence=r.offset, payload=r.payload)
                    for r in records
                ]
            )
            spool.sent = records[-1].offset + 1
            conn.flush()

    # --- group commit ----------------------------------------------------------------------------------

    def _submit(self, work: Work) -> None:
        size = len(work.event.raw) if work.event is not None else 0
        if len(self._work) >= MAX_WAITING or self._waiting_bytes + size > MAX_WAITING_BYTES:
            self.counters["refused_busy"] += 1
            work.done(
                work.ticket, f"the node is busy: {len(self._work)} guaranteed events wait to be stored; retry"
            )
            return
        self._waiting_bytes += size
        self._work.append(work)
        self._wake.set()

    async def _commits(self) -> None:
        assert self.engine is not None
        durability = self.engine.durability
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._work, self._waiting_bytes = self._work, [], 0
            failures = self._failures
            batch = [w for w in batch if w.link is None or failures[w.link] == w.failures]
            try:
                failed, synced, appended = store_batch(self.engine, batch, self.counters, self.vpn_room)
            except Exception as exc:  # a bug must not stop every later guaranteed publish
                log.exception("storing guaranteed events failed")
                failed, synced, appended = {work: f"internal error: {exc!r}" for work in batch}, set(), []
            ends = [(spool, spool.log.next_offset) for spool in appended]
            on_disk = durability.when_synced(*(spool.log for spool, _ in ends))
            if synced:
                try:
                    await durability.written(*synced, records=len(batch) - len(failed))
                except StorageError as exc:  # written, but maybe not where it must be: not "not stored"
                    unknown = f"{ANSWER_UNKNOWN}{exc}; send it again with the same id"
                    failed = {work: failed.get(work) or unknown for work in batch}
                    ends = []  # sent once a later commit is durable, or resent by their publishers
            # Sent once on disk and on the standby (Spool.durable), acknowledged as --fsync says.
            on_disk.add_done_callback(partial(self._durable, ends))
            for work in batch:
                work.done(work.ticket, failed.get(work, "") if failed else "")
            self.counters["stored"] += len(batch) - len(failed)
            self.counters["refused"] += len(failed)
            self._send_acks()

    def _durable(self, ends: list[tuple[Spool, int]], on_disk: asyncio.Future[None]) -> None:
        """Send what a commit spooled, now on disk. A failed fsync is tried again each second: with
        --fsync interval it was acknowledged, and must leave even if nothing more is spooled."""
        if on_disk.cancelled() or not ends:
            return
        if on_disk.exception() is not None:
            asyncio.get_running_loop().call_later(FSYNC_RETRY_SECS, self._sync_again, ends)
            return
        for spool, end in ends:
            spool.durable = max(spool.durable, end)
            self.pump(self._link_of(spool))

    def _sync_again(self, ends: list[tuple[Spool, int]]) -> None:
        if self.engine is not None:
            on_disk = self.engine.durability.when_synced(*(spool.log for spool, _ in ends))
            on_disk.add_done_callback(partial(self._durable, ends))
