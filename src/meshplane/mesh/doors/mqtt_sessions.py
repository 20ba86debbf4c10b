"""The MQTT door's persistent sessions: what a client that asked for one finds when it comes back.

A session is its client's subscriptions (filter -> QoS and options) and, for its QoS 1 ones, a mesh
queue (:mod:`meshplane.mesh.queues`) named ``mqtt-<hash of VPN and client id>`` on this node: guaranteed
events for it are stored there (spooled on the publisher's node first, as for any queue) whether the
client is connected or not, so every QoS 1 message acknowledged to its publisher waits for the client
and is delivered after it reconnects. The session keeps the queue's offsets: ``acked`` (everything
below was acknowledged by the client with PUBACK) and ``sent`` (below it, an event was sent before:
sent again with DUP). Both are checkpointed every tick (not fsynced) and when the client leaves; after
a crash the client gets again, with DUP, what it acknowledged since the last checkpoint (QoS 1 is at
least once). Subscriptions are saved and fsynced before the SUBACK.

Kept in ``<data dir>/mesh/mqtt-sessions.json``; at most :data:`MAX_SESSIONS`. A session ends when its
client connects with a clean session, when MQTT 5's session expiry interval passes after it left, or
(3.1.1, whose sessions do not expire) never.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from meshplane.core.doors.mqtt_topics import to_topic
from meshplane.mesh.preauth import bounded
from meshplane.streams.errors import OffsetOutOfRange, StorageError, StreamError
from meshplane.streams.files import write_atomic

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt_connection import MqttConnection
    from meshplane.mesh.queues import Queues
    from meshplane.streams.service import StreamsService

log = logging.getLogger(__name__)

MAX_SESSIONS = 10_000  # persistent sessions per node
QUEUE_READ = 256  # events read from a session's queue at a time
NEVER = 0xFFFFFFFF  # MQTT 5's session expiry interval that never expires (3.1.1's sessions)


class StoredSession(msgspec.Struct):
    vpn: str
    client_id: str
    subscriptions: dict[str, tuple[int, int]] = {}  # filter -> (QoS granted, options)
    acked: int = 0  # queue offset: everything below it acknowledged
    sent: int = 0  # queue offset: everything below it sent at least once
    expiry: int = NEVER  # seconds after the client leaves
    left_at: float = 0.0  # wall clock when its client left (0: connected, or never left)

    @property
    def queue(self) -> str:
        return queue_name(self.vpn, self.client_id)


def queue_name(vpn: str, client_id: str) -> str:
    digest = hashlib.sha256(f"{vpn}\x00{client_id}".encode()).hexdigest()[:24]
    return f"mqtt-{digest}"


class Sessions:
    def __init__(self, root: Path, queues: Queues) -> None:
        self.path = root / "mqtt-sessions.json"
        self.queues = queues
        self.by_key: dict[tuple[str, str], StoredSession] = {}
        self.dirty = False
        try:
            saved = msgspec.json.decode(self.path.read_bytes(), type=list[StoredSession])
        except FileNotFoundError:
            saved = []
        except (OSError, msgspec.DecodeError) as exc:
            raise StorageError(f"{self.path}: unreadable ({exc})") from exc
        for session in saved:
            self.by_key[(session.vpn, session.client_id)] = session

    def get(self, vpn: str, client_id: str) -> StoredSession | None:
        return self.by_key.get((vpn, client_id))

    def open(self, vpn: str, client_id: str, expiry: int) -> StoredSession:
        """A new persistent session (the caller dropped any old one); StorageError past the bound."""
        if len(self.by_key) >= MAX_SESSIONS:
            raise StorageError(f"{MAX_SESSIONS} persistent MQTT sessions on this node (the limit)")
        session = self.by_key[(vpn, client_id)] = StoredSession(vpn, client_id, {}, expiry=expiry)
        self.save()
        return session

    def drop(self, vpn: str, client_id: str) -> None:
        """End a session: its queue goes (its topic stays, as a deleted queue's does)."""
        session = self.by_key.pop((vpn, client_id), None)
        if session is None:
            return
        self.queues.delete(session.queue, vpn)
        self.save()

    def subscriptions_changed(self, session: StoredSession, patterns: list[str]) -> None:
        """Saved and fsynced; the queue follows the QoS 1 subscriptions' ``patterns`` (mesh patterns,
        without the VPN's prefix), made or dropped."""
        if patterns:
            self.queues.create(session.queue, sorted(set(patterns)), session.vpn)
        else:
            self.queues.delete(session.queue, session.vpn)
        self.save()

    def expire(self, now: float) -> int:
        gone = [
            key
            for key, s in self.by_key.items()
            if s.left_at and s.expiry != NEVER and now - s.left_at >= s.expiry
        ]
        for vpn, client_id in gone:
            self.drop(vpn, client_id)
        return len(gone)

    def save(self, sync: bool = True) -> None:
        data = msgspec.json.encode(list(self.by_key.values()))
        try:
            write_atomic(self.path, data, sync=sync)
            self.dirty = False
        except OSError as exc:
            raise StorageError(f"saving the MQTT sessions: {exc}") from exc

    def checkpoint(self) -> None:
        """The offsets, every tick (not fsynced: a lost checkpoint means resends, with DUP)."""
        if self.dirty:
            try:
                self.save(sync=False)
            except StorageError as exc:
                log.warning("%s", exc)

    @staticmethod
    def now() -> float:
        return time.time()


async def pump_queue(
    engine: StreamsService,
    conn: MqttConnection,
    session: StoredSession,
    count: Callable[[str], None],
    dirty: Callable[[], None],
) -> None:
    """A persistent session's queue to its connected client, from the first offset not acknowledged
    (what was sent before goes again with DUP), as many in flight as the client takes."""
    offset = session.acked
    redelivery_end = session.sent
    while conn.connected and not conn.closing:
        topic = engine.topic_store.topics.get(session.queue)
        if topic is None:
            await asyncio.sleep(0.5)
            continue
        if not conn.has_room:
            conn.room.clear()
            await conn.room.wait()
            continue
        waiter = topic.notifiers[0].waiter()
        try:
            try:
                events = topic.read(0, offset, min(QUEUE_READ, conn.receive_maximum - len(conn.inflight)))
            except OffsetOutOfRange:  # retention took them, or a lost tail: on from what there is
                partition = topic.partitions[0]
                offset = min(max(offset, partition.start_offset), partition.next_offset)
                session.acked = session.sent = offset
                count("queue_offsets_skipped")
                continue
            except StreamError as exc:
                log.warning("MQTT session %s: its queue cannot be read (%s)", bounded(conn.client_id), exc)
                await asyncio.sleep(1.0)
                continue
            if not events:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await waiter.wait()
                continue
        finally:
            topic.notifiers[0].forget(waiter)
        for event in events:
            body = event.body
            payload = body.data if isinstance(body.data, bytes) else msgspec.json.encode(body.data)
            conn.send_from_queue(
                event.offset, to_topic(body.event_type), payload, event.offset < redelivery_end
            )
            offset = event.offset + 1
        session.sent = max(session.sent, offset)
        if not conn.queue_offsets:
            session.acked = offset
        dirty()
