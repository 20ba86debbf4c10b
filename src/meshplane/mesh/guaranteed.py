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

Writes are group-committed: everything that arrived while the last fsync ran shares the next one.
Direct events remain at-most-once; guaranteed ones also reach direct subscribers, as direct ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplane.core.mesh.frames import (
    Frame,
    FrameType,
    decode_spooled,
    encode_frame,
    event_parts,
)
from meshplane.core.subjects import PatternIndex, valid_pattern
from meshplane.mesh.holders import Holder, MeshEvent
from meshplane.mesh.peer_queues import Change, PeerQueuesLog
from meshplane.mesh.queues import PREFIX, Queue, Queues, stored_event
from meshplane.mesh.spool import Spool, SpoolFull, SpoolLimits, spool_directory, spool_peer
from meshplane.streams.errors import CorruptRecords, NotStored, StorageError, StreamError

if TYPE_CHECKING:
    from meshplane.mesh.links import Link
    from meshplane.mesh.node import MeshNode
    from meshplane.streams.durability import Syncable
    from meshplane.streams.service import StreamsService

log = logging.getLogger(__name__)

MAX_WAITING = 200_000  # guaranteed events waiting for the next group commit, at most ...
MAX_WAITING_BYTES = 256 * 1024 * 1024  # ... and their bytes


@dataclass(eq=False)
class _Work:
    event: MeshEvent | None  # None: a bad SPOOLED frame, confirmed in its turn
    spools: list[Spool]
    queues: list[Queue]
    done: Callable[[str], None]  # "" once stored (and synced as the policy says), else why not


class Guaranteed:
    """A node's spools, queues and group commit; enabled once the node has a streams service."""

    def __init__(self, node: MeshNode, limits: SpoolLimits) -> None:
        self.node = node
        self.limits = limits
        self.engine: StreamsService | None = None
        self.spools: dict[str, Spool] = {}
        self.queues = Queues(node)
        self.counters: Counter[str] = Counter()
        self._root = Path()
        self._work: list[_Work] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed: set[str] = set()  # peers whose events failed to store: no ACK past the failure
        self._acks: dict[str, int] = {}  # peer -> highest spool offset handled in this batch
        self._waiting_bytes = 0
        self.peer_queues: dict[str, set[str]] = {}  # peer -> its queues' patterns (without the prefix)
        self._peer_trie: PatternIndex[str] = PatternIndex()
        self._peer_log: PeerQueuesLog | None = None

    @property
    def enabled(self) -> bool:
        return self.engine is not None

    # --- lifecycle -----------------------------------------------------------------------------------

    def open(self, engine: StreamsService) -> None:
        """Load the spools and the queues (subscribing them, so they are advertised from the start)."""
        self.engine = engine
        self._root = engine.root / "mesh"
        spools = self._root / "spool"
        spools.mkdir(parents=True, exist_ok=True)
        for directory in sorted(p for p in spools.iterdir() if p.is_dir()):
            peer = spool_peer(directory)
            if peer is not None:
                self.spools[peer] = Spool(directory, peer, self.limits, engine.files)
        self.queues.open(engine, self._root)
        self._peer_log = PeerQueuesLog(self._root)
        for peer, patterns in self._peer_log.load().items():
            self._set_peer_queues(peer, {p for p in patterns if valid_pattern(p) is not None})

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
            work.done("the node is shutting down")
        self._work.clear()
        for spool in self.spools.values():
            spool.close()
        if self._peer_log is not None:
            self._peer_log.close()

    def tick(self) -> None:
        for spool in self.spools.values():
            spool.save()
        if self._peer_log is not None:
            self._peer_log.sync()

    def forget(self, peer: str) -> dict[str, int]:
        """A departed node: its spool (with what it never confirmed) and its remembered queues go."""
        spool = self.spools.pop(peer, None)
        dropped = spool.pending if spool is not None else 0
        if spool is not None:
            spool.close()
            shutil.rmtree(spool.directory, ignore_errors=True)
        patterns = self.peer_queues.get(peer, set())
        if patterns or spool is not None:
            self._set_peer_queues(peer, set())
            if self._peer_log is not None:
                self._peer_log.append(Change(peer, forget=True), self.peer_queues)
        self._failed.discard(peer)
        return {"spooled_events_dropped": dropped, "queues_forgotten": len(patterns)}

    # --- queues --------------------------------------------------------------------------------------

    def spool_status(self) -> list[dict[str, Any]]:
        return [
            {
                "peer": s.peer,
                "pending": s.pending,
                "bytes": s.log.size_bytes,
                "acked": s.acked,
                "sent": s.sent,
                "refused": s.refused,
            }
            for s in sorted(self.spools.values(), key=lambda s: s.peer)
        ]

    # --- publishing: on the node the publisher is on --------------------------------------------------

    def publish(self, event: MeshEvent, done: Callable[[str], None], skip: Holder | None = None) -> None:
        """Route ``event`` (its flags say guaranteed) and call ``done`` once it is stored everywhere it
        must be: the spool of each node whose queues want it, and this node's queues."""
        if self.engine is None:
            done("this mesh node keeps no guaranteed events (it runs without a streams data directory)")
            return
        peers = self._peer_trie.match(event.subject)
        spools = [self._spool(peer) for peer in sorted(peers)]
        queues = [h for h in self.node.router.route(PREFIX + event.subject).local if isinstance(h, Queue)]
        # The spooled copy serves the direct subscribers of the peers it goes to.
        self.node.route_direct(event, peers, skip)
        self._submit(_Work(event, spools, queues, done))

    async def publish_async(self, event: MeshEvent, skip: Holder | None = None) -> None:
        """:meth:`publish`, awaited: raises NotStored when it was not stored."""
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def done(error: str) -> None:
            if not answer.done():
                answer.set_result(error)

        self.publish(event, done, skip)
        error = await answer
        if error:
            raise NotStored(error)

    def _spool(self, peer: str) -> Spool:
        spool = self.spools.get(peer)
        if spool is None:
            assert self.engine is not None
            directory = spool_directory(self._root / "spool", peer)
            spool = self.spools[peer] = Spool(directory, peer, self.limits, self.engine.files)
        return spool

    # --- on the destination ----------------------------------------------------------------------------

    def on_spooled(self, link: Link, frame: Frame) -> None:
        peer, offset = link.peer, frame.sequence

        def done(error: str) -> None:
            self._confirm(peer, offset, error)

        if self.engine is None:  # no queues here, ever: nothing to wait for
            self.counters["spooled_unwanted"] += 1
            self._confirm(peer, offset, "")
            self._send_acks()
            return
        try:
            inner = decode_spooled(frame, self.node.config.max_payload)
            if not self.node.valid_subject(inner.subject):
                raise ValueError(f"subject {inner.subject[:80]!r}")
        except ValueError:
            # Nothing will make it better: confirmed (in its turn) and counted.
            self.counters["bad_spooled"] += 1
            self._submit(_Work(None, [], [], done))
            return
        timestamp, body = event_parts(inner)
        event = MeshEvent(
            inner.source, inner.subject, inner.sequence, timestamp, body, inner.flags, inner.raw
        )
        self.node.routes.deliver_remote(link, event, quiet=True)
        queues = [h for h in self.node.router.route(PREFIX + event.subject).local if isinstance(h, Queue)]
        if not queues:
            self.counters["spooled_unwanted"] += 1  # the queue went away on the way
        self._submit(_Work(event, [], queues, done))

    def _confirm(self, peer: str, offset: int, error: str) -> None:
        """One SPOOLED frame handled: confirmed (cumulatively, once per batch) unless it failed."""
        link = self.node.links.get(peer)
        if peer in self._failed or link is None or link.conn is None:
            return
        if error:
            # Confirming later ones would skip this one: the link starts over and the peer resends.
            self._failed.add(peer)
            self._acks.pop(peer, None)
            self.counters["store_failures"] += 1
            log.warning("could not store guaranteed events from %s (%s): the link starts over", peer, error)
            link.conn.close()
            return
        self._acks[peer] = offset  # frames are handled in order: the last is the highest

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, {}
        for peer, offset in acks.items():
            link = self.node.links.get(peer)
            if link is not None and link.conn is not None:
                link.conn.send(encode_frame(FrameType.ACK, self.node.node_id, sequence=offset))

    def on_ack(self, link: Link, frame: Frame) -> None:
        spool = self.spools.get(link.peer)
        if spool is not None and spool.confirm(frame.sequence):
            self.pump(link.peer)

    # --- links -----------------------------------------------------------------------------------------

    def learnt(self, peer: str, gained: Iterable[str], lost: Iterable[str]) -> None:
        """Interest a peer gained or lost: its queues' patterns are remembered apart."""
        added = {p[len(PREFIX) :] for p in gained if p.startswith(PREFIX)}
        removed = {p[len(PREFIX) :] for p in lost if p.startswith(PREFIX)}
        if not added and not removed:
            return
        have = self.peer_queues.get(peer, set())
        now = (have | added) - removed
        if now != have:
            self._set_peer_queues(peer, now)
            self._record(Change(peer, sorted(now - have), sorted(have - now)))

    def link_up(self, peer: str, interest: Iterable[str]) -> None:
        """The peer's interest is learnt afresh (``interest``): its queues are exactly those now."""
        now = {p[len(PREFIX) :] for p in interest if p.startswith(PREFIX)}
        have = self.peer_queues.get(peer, set())
        if now != have:
            self._set_peer_queues(peer, now)
            self._record(Change(peer, sorted(now - have), sorted(have - now)))
        self.pump(peer)

    def _set_peer_queues(self, peer: str, patterns: set[str]) -> None:
        for pattern in self.peer_queues.pop(peer, set()) - patterns:
            self._peer_trie.remove(pattern, peer)
        for pattern in patterns:
            self._peer_trie.insert(pattern, peer)
        if patterns:
            self.peer_queues[peer] = patterns

    def _record(self, change: Change) -> None:
        if self._peer_log is not None:
            self._peer_log.append(change, self.peer_queues)

    def link_down(self, peer: str) -> None:
        self._failed.discard(peer)
        spool = self.spools.get(peer)
        if spool is not None:
            spool.rewind()

    def pump(self, peer: str) -> None:
        """Send what the peer's spool holds and it has not been sent, while the socket takes it."""
        spool = self.spools.get(peer)
        link = self.node.links.get(peer)
        if spool is None or link is None or link.state != "up" or link.conn is None:
            return
        if "hold_spooled" in self.node.config.faults:
            return
        conn = link.conn
        while not conn.paused and conn.is_open:
            try:
                records = spool.to_send()
            except (StorageError, CorruptRecords) as exc:
                self.counters["spool_read_errors"] += 1
                log.error("spool for %s: cannot read at offset %d (%s)", peer, spool.sent, exc)
                return
            if not records:
                return
            for record in records:
                conn.send(
                    encode_frame(
                        FrameType.SPOOLED, self.node.node_id, sequence=record.offset, payload=record.payload
                    )
                )
            spool.sent = records[-1].offset + 1
            conn.flush()

    # --- group commit ----------------------------------------------------------------------------------

    def _submit(self, work: _Work) -> None:
        size = len(work.event.raw) if work.event is not None else 0
        if len(self._work) >= MAX_WAITING or self._waiting_bytes + size > MAX_WAITING_BYTES:
            self.counters["refused_busy"] += 1
            work.done(f"the node is busy: {len(self._work)} guaranteed events wait to be stored; retry")
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
            try:
                failed, synced = self._store(batch)
            except Exception as exc:  # a bug must not stop every later guaranteed publish
                log.exception("storing guaranteed events failed")
                failed, synced = {work: f"internal error: {exc!r}" for work in batch}, set()
            for peer in {spool.peer for work in batch if work not in failed for spool in work.spools}:
                self.pump(peer)  # before the fsync: a copy that arrives first is harmless
            if synced:
                try:
                    await durability.written(*synced, records=len(batch) - len(failed))
                except StorageError as exc:
                    failed = {work: str(exc) for work in batch}
            for work in batch:
                work.done(failed.get(work, ""))
            self.counters["stored"] += len(batch) - len(failed)
            self.counters["refused"] += len(failed)
            self._send_acks()

    def _store(self, batch: list[_Work]) -> tuple[dict[_Work, str], set[Syncable]]:
        """Append a batch to spools and queues, one write per spool and per queue: the works that
        failed (and why), and what must be synced before the others are acknowledged. A failed
        write fails the works it held; what they wrote elsewhere is dropped by id if they are sent
        again."""
        assert self.engine is not None
        failed: dict[_Work, str] = {}
        by_spool: dict[Spool, list[tuple[_Work, bytes]]] = {}
        by_queue: dict[Queue, list[tuple[_Work, MeshEvent]]] = {}
        room: Counter[Spool] = Counter()
        for work in batch:
            if work.event is None:
                continue
            raw, size = work.event.raw, len(work.event.raw)
            try:
                for spool in work.spools:
                    spool.check_room(
                        size, by_spool_events=len(by_spool.get(spool, ())), extra_bytes=room[spool]
                    )
            except SpoolFull as exc:
                failed[work] = str(exc)
                continue
            for spool in work.spools:
                by_spool.setdefault(spool, []).append((work, raw))
                room[spool] += size
            for queue in work.queues:
                by_queue.setdefault(queue, []).append((work, work.event))
        synced: set[Syncable] = set()
        for spool, entries in by_spool.items():
            try:
                spool.append([raw for _, raw in entries])
                synced.add(spool.log)
            except StorageError as exc:
                failed.update((work, str(exc)) for work, _ in entries)
        for queue, pairs in by_queue.items():
            fresh: dict[str, tuple[_Work, MeshEvent]] = {}
            for work, event in pairs:
                event_id = event.event_id
                if work in failed:
                    continue
                if event_id in queue.recent or event_id in fresh:
                    queue.duplicates += 1
                    self.counters["duplicates_dropped"] += 1
                else:
                    fresh[event_id] = (work, event)
            if not fresh:
                continue
            try:
                if queue.name not in self.engine.topics:  # deleted under the queue: made again
                    self.engine.topic_store.create(queue.name, 1)
                _, more = self.engine.append_topic(queue.name, [stored_event(e) for _, e in fresh.values()])
            except StreamError as exc:
                failed.update((work, str(exc)) for work, _ in fresh.values())
                continue
            synced.update(more)
            for event_id in fresh:
                queue.remember(event_id)
            queue.stored += len(fresh)
        return failed, synced
