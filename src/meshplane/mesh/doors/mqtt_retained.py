"""The MQTT door's retained messages: the last retained PUBLISH of each topic, bounded, kept on disk
and the same on every node.

A retained PUBLISH (or a clear: an empty payload) becomes a stamped record
(:mod:`meshplane.core.doors.mqtt_retained`, which says which copy wins), written to the node's journal
(:mod:`.mqtt_retained_journal`, with a data directory) before the PUBLISH is acknowledged, and sent to
the other nodes as a direct event on ``$mqtt.<subject>`` (reserved: no client of the mesh sees it),
which every door subscribes to. A node whose link to a peer comes up sends it what it holds
(:mod:`.mqtt_retained_catchup`), so a node started later learns what was retained before. Bounded
(:data:`MAX_RETAINED`, :data:`MAX_RETAINED_BYTES`, tombstones as many as topics), each VPN to its share of
them: a new topic past its VPN's share is not retained, counted per VPN.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_retained import (
    MAX_RETAINED,
    MAX_RETAINED_BYTES,
    Outcome,
    Record,
    RetainedTable,
    decode_body,
    encode_body,
)
from meshplane.core.doors.mqtt_topics import RETAIN_PREFIX, matches, to_topic
from meshplane.core.mesh.vpn import outward, prefix_of, vpn_of
from meshplane.mesh.doors.mqtt_filters import qos_for
from meshplane.mesh.doors.mqtt_retained_catchup import send_catch_up
from meshplane.mesh.doors.mqtt_retained_journal import RetainedJournal
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.links import Link
from meshplane.mesh.preauth import QuietLog

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt import MqttDoor
    from meshplane.mesh.doors.mqtt_connection import MqttConnection

log = logging.getLogger(__name__)

RETAINED_SLICE = 256  # retained messages looked at per turn of the loop


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class RetainedStore:
    """The node's retained messages, each VPN's in its own share of the pool: the node's bounds divided
    by its VPNs (``vpns()``: their number, read at each PUBLISH, so a reload changes the shares), so a
    tenant filling its share refuses no other tenant's retained PUBLISH. With :meth:`open`, on disk."""

    def __init__(
        self,
        max_count: int = MAX_RETAINED,
        max_bytes: int = MAX_RETAINED_BYTES,
        vpns: Callable[[], int] = lambda: 1,
        origin: str = "node",
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.table = RetainedTable(max_count, max_bytes, max_tombstones=max_count)
        self.vpns, self.origin, self.clock = vpns, origin, clock  # origin: the node's id
        self.journal: RetainedJournal | None = None
        self.refused: Counter[str] = Counter()  # VPN -> retained PUBLISHes refused past its share
        self.learnt: Counter[str] = Counter()  # peers' records by outcome (kept, stale, full, invalid)
        self.quiet = QuietLog(log)

    def open(self, root: Path, policy: str) -> None:
        """Keep the records in ``root`` (the node's ``<data dir>/mesh``), loading what is there."""
        journal = RetainedJournal(root, policy)
        records = journal.load()
        # Its own records are trusted as far as the clock goes: one set back since they were written
        # must not make them "ahead" of it, and invalid.
        now = max([self.clock(), *(record.at for record in records)])
        shares = max(self.vpns(), 1)
        for record in records:
            self.table.offer(record, now, shares)
        self.table.expire(self.clock())
        self.journal = journal
        if journal.file.torn:
            journal.compact(self.table.records())
        log.info("MQTT: %d retained messages from %s", self.table.count, journal.file.path)

    @property
    def count(self) -> int:
        return self.table.count

    @property
    def total_bytes(self) -> int:
        return self.table.bytes_of.total()

    def usage(self, vpn: str) -> tuple[int, int]:
        """A VPN's retained messages and their bytes."""
        return self.table.live_of[vpn], self.table.bytes_of[vpn]

    def put(self, subject: str, payload: bytes, qos: int) -> Record | None:
        """Retain (or, with an empty payload, clear) ``subject``'s message, on disk first: the record
        to send the other nodes, None past its VPN's share. Raises OSError (nothing kept) when the
        journal could not take it."""
        now = self.clock()
        record = Record(subject, payload, qos, self.table.stamp(subject, now), self.origin)
        shares = max(self.vpns(), 1)
        outcome = self.table.check(record, now, shares)
        if outcome is Outcome.FULL:
            vpn = vpn_of(subject)
            self.refused[vpn] += 1
            count, size = self.usage(vpn)
            self.quiet.warning(
                f"retained_{vpn}",
                "MQTT: a retained message of VPN %r not kept: its share of the node's retained messages "
                "(%d of %d, %d of %d bytes) is full",
                vpn,
                count,
                self.table.max_count // shares,
                size,
                self.table.max_bytes // shares,
            )
            return None
        if outcome is not Outcome.KEPT:  # an origin no node has: nothing to keep
            return None
        self._keep(record, shares, own=True)
        return record

    def learn(self, record: Record) -> Outcome:
        """A peer's record: kept if it wins and fits (on disk too; a failed write is logged and the
        journal rewritten whole at the next change: the record's origin holds it meanwhile)."""
        shares = max(self.vpns(), 1)
        outcome = self.table.check(record, self.clock(), shares)
        self.learnt[outcome.value] += 1
        if outcome is Outcome.KEPT:
            try:
                self._keep(record, shares, own=False)
            except OSError as exc:
                self.table.apply(record, shares)
                assert self.journal is not None
                self.journal.file.torn = True
                self.quiet.warning("retained_journal", "MQTT: retained journal not written: %s", exc)
        return outcome

    def _keep(self, record: Record, shares: int, own: bool) -> None:
        if self.journal is not None:
            subject = record.subject

            def held() -> Iterable[Record]:
                yield from (r for r in self.table.records() if r.subject != subject)
                yield record

            self.journal.put(record, held, self.table.entries, own)
        self.table.apply(record, shares)

    def tick(self) -> None:
        """Once a second: tombstones past their time forgotten, the journal fsynced as --fsync says."""
        self.table.expire(self.clock())
        if self.journal is not None:
            self.journal.sync()

    def candidates(self, pattern: str) -> list[tuple[str, Record]]:
        """The retained messages ``pattern`` (internal, with its VPN's prefix) may match: its VPN's only."""
        return [(record.subject, record) for record in self.table.live(vpn_of(pattern))]

    def close(self) -> None:
        if self.journal is not None:
            self.journal.sync()
            self.journal.close()


class RetainedSender:
    """The retained messages a connection's new subscriptions get, a slice per turn of the loop: one
    SUBSCRIBE of 1,000 filters over 10,000 retained topics held the node's loop for tens of seconds."""

    def __init__(self, conn: MqttConnection, limit: int) -> None:
        self.conn = conn
        self.limit = limit  # filters whose retained messages are still to be sent, at most
        self.due: deque[str] = deque()  # patterns of new subscriptions
        self.task: asyncio.Task[None] | None = None

    def add(self, patterns: Iterable[str]) -> bool:
        """Send the retained messages of ``patterns`` (each once); False: too many are due."""
        self.due.extend(dict.fromkeys(patterns))
        if len(self.due) > self.limit:
            return False
        if self.due and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._send())
        return True

    async def _send(self) -> None:
        conn = self.conn
        try:
            while self.due and not conn.closing:
                pattern = self.due.popleft()
                kept = conn.door.retained.candidates(pattern)
                for start in range(0, len(kept), RETAINED_SLICE):
                    for subject, message in kept[start : start + RETAINED_SLICE]:
                        if matches(pattern, subject):
                            qos = min(message.qos, qos_for(conn, subject))
                            topic = to_topic(outward(conn.prefix, subject))
                            conn.deliver_publish(topic, message.payload, qos, retain=True)
                    await asyncio.sleep(0)
                    if conn.closing:
                        return
        finally:
            self.task = None


class RetainHolder:
    """The door's holder of ``$mqtt.`` subjects: retained messages published on other nodes, or sent
    by a peer whose link came up. Each is checked as any peer's record (a bad body, a stamp far ahead
    or past the VPN's share: not kept, counted by outcome). It sends this node's records too."""

    def __init__(self, door: MqttDoor) -> None:
        self.door = door
        self.sequence = itertools.count(1)  # of the door's ``$mqtt.`` events (dedup is per subject)
        # One catch-up per link: a link that flaps restarts its catch-up instead of adding one (each holds
        # a copy of the table's records).
        self.catching_up: dict[Link, asyncio.Task[None]] = {}

    def deliver(self, event: MeshEvent) -> None:
        if event.source != self.door.origin:
            record = decode_body(event.subject[len(RETAIN_PREFIX) :], event.body)
            if record is None:
                self.door.count("retained_bad")
            else:
                self.door.retained.learn(record)

    def hold(self) -> None:
        """Each VPN's ``$mqtt.`` subjects: its retained messages from the other nodes (a VPN a reload
        adds too: it is given up with the VPN)."""
        node = self.door.node
        wanted = {RETAIN_PREFIX + prefix_of(vpn) + "#" for vpn in node.config.vpns}
        held = node.router.patterns_of(self)
        for pattern in sorted(wanted - held):
            node.subscribe(self, pattern)
        for pattern in sorted(held - wanted):
            node.unsubscribe(self, pattern)

    def retain(self, subject: str, payload: bytes, qos: int) -> str:
        """Retained here (on disk first, with a data directory), and on the other nodes (a direct event
        on ``$mqtt.<subject>``). Returns why it was not stored (the journal's write failed: a QoS 1
        PUBLISH is then not acknowledged), or "" (kept, or refused past its VPN's share, counted)."""
        door = self.door
        try:
            record = door.retained.put(subject, payload, qos)
        except OSError as exc:
            door.count("retained_unsaved")
            door.quiet.warning("retained_unsaved", "MQTT: a retained message not written to disk: %s", exc)
            return f"the retained message could not be stored ({exc.strerror or exc})"
        if record is None:
            door.count("retained_refused")
        else:
            door.node.route_direct(self.event(record), skip=self)
        return ""

    def event(self, record: Record) -> MeshEvent:
        """A record as the ``$mqtt.`` event that carries it to the other nodes."""
        subject = RETAIN_PREFIX + record.subject
        return MeshEvent(self.door.origin, subject, next(self.sequence), record.at, encode_body(record))

    def catch_up(self, link: Link) -> None:
        """What this node holds, to a peer whose link just came up."""
        if self.door.retained.table.entries:
            running = self.catching_up.pop(link, None)
            if running is not None:
                running.cancel()
            task = asyncio.get_running_loop().create_task(send_catch_up(self, link))
            self.catching_up[link] = task
            self.door.tasks.add(task)
            task.add_done_callback(self.door.tasks.discard)
            task.add_done_callback(lambda done: self._finished(link, done))

    def _finished(self, link: Link, task: asyncio.Task[None]) -> None:
        if self.catching_up.get(link) is task:
            del self.catching_up[link]
