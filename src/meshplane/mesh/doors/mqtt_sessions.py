"""The MQTT door's persistent sessions: what a client that asked for one finds when it comes back.

A session is its client's subscriptions (filter -> QoS and options) and, for its QoS 1 ones, a mesh
queue (:mod:`meshplane.mesh.queues`) named ``mqtt-<hash of VPN and client id>`` on this node: guaranteed
events for it are stored there (spooled on the publisher's node first, as for any queue) whether the
client is connected or not, so every QoS 1 message acknowledged to its publisher waits for the client
and is delivered after it reconnects. The session keeps the queue's offsets: ``acked`` (everything
below was acknowledged by the client with PUBACK) and ``sent`` (below it, an event was sent before:
sent again with DUP). Both are checkpointed every tick (not fsynced) and when the client leaves; after
a crash the client gets again, with DUP, what it acknowledged since the last checkpoint (QoS 1 is at
least once). Subscriptions are saved and fsynced before the SUBACK; the queue is made again from them
when the node starts (``saved=False``: not in the node's queues file, rewritten on the loop).

Kept in ``<data dir>/mesh/mqtt-sessions.json``, written whole (a temporary file, fsynced, renamed) in a
worker thread, never on the event loop; each session is encoded when it changes, so a SUBSCRIBE costs
the loop its own session's bytes, not the file's. Bounded: :data:`MAX_SESSIONS` in all, each VPN its
share of them and of :data:`MAX_SESSION_QUEUES` (the rest of the node's queues stay for mesh
clients), :data:`MAX_SESSIONS_PER_USER` per VPN user, :data:`MAX_SESSION_BYTES` per session and
:data:`MAX_SESSIONS_BYTES` in all. A session ends when its client connects with a clean session, or
when its expiry passes after its client left: MQTT 5's Session Expiry Interval, capped by ``[mqtt]
session_expiry`` (``--mqtt-session-expiry``), which 3.1.1's sessions get (as mosquitto's
``persistent_client_expiration``); its queue is deleted then (the queue's topic and what it holds stay,
as a deleted queue's do, under the topic's retention).
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

from meshplane.core.doors.mqtt_packets import Code
from meshplane.core.doors.mqtt_topics import BadTopic, to_pattern, to_topic
from meshplane.core.doors.nats_protocol import NOT_WRAPPED
from meshplane.core.mesh.vpn import queue_topic
from meshplane.mesh.preauth import QuietLog, bounded
from meshplane.streams import files
from meshplane.streams.errors import LimitReached, OffsetOutOfRange, StorageError, StreamError

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt_connection import MqttConnection
    from meshplane.mesh.queues import Queues, QueueUser
    from meshplane.streams.service import StreamsService

log = logging.getLogger(__name__)

MAX_SESSIONS = 10_000  # persistent sessions per node (each VPN its share)
MAX_SESSION_QUEUES = 500  # sessions with a queue per node (each VPN its share; --mesh-max-queues: all)
MAX_SESSIONS_PER_USER = 100  # persistent sessions of one VPN user
MAX_SESSION_BYTES = 64 * 1024  # one session, as saved (its filters, mostly)
MAX_SESSIONS_BYTES = 32 * 1024 * 1024  # the sessions file
FILTER_BYTES = 16  # what a filter costs in the file beside its own bytes (its QoS, options, quotes)
DEFAULT_EXPIRY = 7 * 24 * 3600  # seconds: 3.1.1's sessions, and the cap on MQTT 5's
QUEUE_READ = 256  # events read from a session's queue at a time
NEVER = 0xFFFFFFFF  # MQTT 5's session expiry interval that never expires


class Subscription(msgspec.Struct, frozen=True):
    """A connected client's subscription."""

    pattern: str  # the mesh pattern, with the VPN's prefix
    qos: int
    options: int


class StoredSession(msgspec.Struct):
    vpn: str
    client_id: str
    subscriptions: dict[str, tuple[int, int]] = {}  # filter -> (QoS granted, options)
    acked: int = 0  # queue offset: everything below it acknowledged
    sent: int = 0  # queue offset: everything below it sent at least once
    expiry: int = DEFAULT_EXPIRY  # seconds after the client leaves
    left_at: float = 0.0  # wall clock when its client left (0: connected)
    user: str = ""  # the VPN user it logged in as ("": none proven)

    @property
    def queue(self) -> str:
        return queue_name(self.vpn, self.client_id)

    @property
    def key(self) -> tuple[str, str]:
        return (self.vpn, self.client_id)


def queue_name(vpn: str, client_id: str) -> str:
    digest = hashlib.sha256(f"{vpn}\x00{client_id}".encode()).hexdigest()[:24]
    return f"mqtt-{digest}"


class Sessions:
    def __init__(
        self, root: Path, queues: Queues, vpns: Callable[[], int], expiry_cap: int = DEFAULT_EXPIRY
    ) -> None:
        self.path = root / "mqtt-sessions.json"
        self.queues = queues
        self.vpns = vpns  # how many VPNs share the bounds
        self.by_key: dict[tuple[str, str], StoredSession] = {}
        self.encoded: dict[tuple[str, str], bytes] = {}  # each session as saved
        self.bytes = 0  # of ``encoded``
        self.pending: dict[tuple[str, str], int] = {}  # filters' bytes taken since the last encoding
        self.queued: set[tuple[str, str]] = set()  # sessions with a queue
        self.dirty: set[tuple[str, str]] = set()  # to encode again before the next write
        self.expired = 0
        self._wanted = False  # a write (not awaited) is due
        self._failed = False  # the last write failed
        self._synced = False  # ... fsynced
        self._waiters: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None
        self.quiet = QuietLog(log)
        try:
            saved = msgspec.json.decode(self.path.read_bytes(), type=list[StoredSession])
        except FileNotFoundError:
            saved = []
        except (OSError, msgspec.DecodeError) as exc:
            raise StorageError(f"{self.path}: unreadable ({exc})") from exc
        now = self.now()
        for session in saved:
            session.expiry = min(session.expiry, expiry_cap)
            session.left_at = session.left_at or now  # no client is connected after a restart
            self._add(session)
            if session.key in self.queued:
                self._queue_again(session)

    def _queue_again(self, session: StoredSession) -> None:
        """Its queue as its QoS 1 filters make it: kept here, not in the queues file (see ``queues``)."""
        patterns = sorted({to_pattern(f) for f, (qos, _) in session.subscriptions.items() if qos})
        try:
            self.queues.create(session.queue, patterns, session.vpn, saved=False)
        except (StreamError, BadTopic) as exc:  # its VPN was removed, say: it gets nothing stored
            log.warning("MQTT session %s: its queue is not made again (%s)", bounded(session.client_id), exc)

    def _add(self, session: StoredSession) -> None:
        self.by_key[session.key] = session
        self._encode(session)
        if any(qos for qos, _ in session.subscriptions.values()):
            self.queued.add(session.key)

    def _encode(self, session: StoredSession) -> None:
        data = msgspec.json.encode(session)
        self.bytes += len(data) - len(self.encoded.get(session.key, b""))
        self.encoded[session.key] = data
        self.pending.pop(session.key, None)

    def get(self, vpn: str, client_id: str) -> StoredSession | None:
        return self.by_key.get((vpn, client_id))

    def why_full(self, vpn: str, user: str) -> str:
        """Why a new session of ``vpn`` (and its proven ``user``) is refused: "" when it is not."""
        share = MAX_SESSIONS // max(self.vpns(), 1)
        if len(self.by_key) >= MAX_SESSIONS:
            return f"{MAX_SESSIONS} persistent MQTT sessions on this node (its limit)"
        if sum(1 for s in self.by_key.values() if s.vpn == vpn) >= share:
            return f"Message VPN {vpn!r}: {share} persistent MQTT sessions on this node (its share)"
        if user and sum(1 for s in self.by_key.values() if s.key[0] == vpn and s.user == user) >= (
            MAX_SESSIONS_PER_USER
        ):
            return f"user {user!r}: {MAX_SESSIONS_PER_USER} persistent MQTT sessions on this node (the limit)"
        if self.bytes + FILTER_BYTES * 16 > MAX_SESSIONS_BYTES:
            return f"the persistent MQTT sessions hold {MAX_SESSIONS_BYTES} bytes on this node (the limit)"
        return ""

    def open(self, vpn: str, client_id: str, expiry: int, user: str = "") -> StoredSession:
        """A new persistent session (the caller dropped any old one); LimitReached past a bound."""
        refused = self.why_full(vpn, user)
        if refused:
            raise LimitReached(refused)
        session = StoredSession(vpn, client_id, {}, expiry=expiry, user=user)
        self._add(session)
        self.save()
        return session

    def room(self, session: StoredSession, topic_filter: str) -> bool:
        """Whether the session may take one more filter (its bytes and all sessions' stay bounded)."""
        cost = len(topic_filter.encode()) + FILTER_BYTES
        pending = self.pending.get(session.key, 0) + cost
        if len(self.encoded.get(session.key, b"")) + pending > MAX_SESSION_BYTES:
            return False
        if self.bytes + sum(self.pending.values()) + cost > MAX_SESSIONS_BYTES:
            return False
        self.pending[session.key] = pending
        return True

    def drop(self, vpn: str, client_id: str) -> None:
        """End a session: its queue goes (its topic stays, as a deleted queue's does)."""
        session = self.by_key.pop((vpn, client_id), None)
        if session is None:
            return
        self.bytes -= len(self.encoded.pop(session.key, b""))
        self.pending.pop(session.key, None)
        self.queued.discard(session.key)
        self.dirty.discard(session.key)
        self.queues.delete(session.queue, vpn)
        self.save()

    def subscriptions_changed(
        self, session: StoredSession, patterns: list[str], who: QueueUser | None = None
    ) -> asyncio.Future[None]:
        """The queue follows the QoS 1 subscriptions' ``patterns`` (mesh patterns, without the VPN's
        prefix), made or dropped (LimitReached past the VPN's share of session queues, Forbidden past
        ``who``'s queue permissions); done once the subscriptions are saved and fsynced."""
        if patterns:
            if session.key not in self.queued:
                share = MAX_SESSION_QUEUES // max(self.vpns(), 1)
                if sum(1 for vpn, _ in self.queued if vpn == session.vpn) >= share:
                    raise LimitReached(
                        f"Message VPN {session.vpn!r}: {share} persistent MQTT sessions with QoS 1 "
                        f"subscriptions (a queue each) on this node (its share)"
                    )
            self.queues.create(session.queue, sorted(set(patterns)), session.vpn, who, saved=False)
            self.queued.add(session.key)
        else:
            self.queues.delete(session.queue, session.vpn)
            self.queued.discard(session.key)
        self._encode(session)
        return self.save(wait=True)

    def expire(self, now: float) -> int:
        """End the sessions whose expiry passed since their client left; how many."""
        gone = [key for key, s in self.by_key.items() if s.left_at and now - s.left_at >= s.expiry]
        for vpn, client_id in gone:
            self.drop(vpn, client_id)
        return len(gone)

    def changed(self, session: StoredSession) -> None:
        """Its offsets or its client's coming and going: written at the next checkpoint."""
        if session.key in self.by_key:
            self.dirty.add(session.key)

    def checkpoint(self) -> None:
        """What changed, every tick (not fsynced: a lost checkpoint means resends, with DUP)."""
        if self._failed:  # the last write failed: the file is behind, subscriptions perhaps too
            self._failed = False
            self.save()
        elif self.dirty:
            self.save(sync=False)

    def save(self, *, sync: bool = True, wait: bool = False) -> asyncio.Future[None]:
        """Write the file (in a worker thread, a write at a time); done (StorageError on failure, the
        previous file left whole) once a write begun after this call has ended."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if wait:
            self._waiters.append(done)
        else:
            done.set_result(None)
            self._wanted = True
        self._synced |= sync
        if self._writer is None:
            self._writer = loop.create_task(self._write())
        return done

    async def _write(self) -> None:
        try:
            while self._wanted or self._waiters:
                waiters, self._waiters, self._wanted = self._waiters, [], False
                synced, self._synced = self._synced, False
                for key in self.dirty:
                    self._encode(self.by_key[key])
                self.dirty.clear()
                parts = list(self.encoded.values())
                try:
                    await asyncio.to_thread(_write_parts, self.path, parts, synced)
                except OSError as exc:
                    error: StorageError | None = StorageError(f"saving the MQTT sessions: {exc}")
                    self.quiet.warning("write", "%s", error)  # again each second while it fails
                else:
                    error = None
                    files.replaced(self.path, synced)
                self._failed = error is not None
                for waiter in waiters:
                    if waiter.done():
                        continue
                    if error is not None:
                        waiter.set_exception(error)
                    else:
                        waiter.set_result(None)
        finally:
            self._writer = None

    async def close(self) -> None:
        """The last write, offsets included (the node is going down)."""
        self.dirty.update(self.by_key)
        with contextlib.suppress(StorageError):
            await self.save(wait=True)

    @staticmethod
    def now() -> float:
        return time.time()


def after_saved(conn: MqttConnection, then: Callable[[], None]) -> None:
    """``then`` (a SUBACK or UNSUBACK) once the session's subscriptions are on disk, at once without a
    save under way; what the client sent meanwhile waits, in order (its socket is not read)."""
    saving = conn.saving
    if saving is None:
        then()
        return
    if conn.transport is not None:
        conn.transport.pause_reading()

    def saved(_: asyncio.Future[None]) -> None:
        conn.saving = None
        error = saving.exception()
        if conn.closing:
            return
        if error is not None:
            conn.door.count("session_not_saved")
            conn.close(Code.UNSPECIFIED, f"the session's subscriptions could not be saved: {error}")
            return
        then()
        conn.release_held()

    saving.add_done_callback(saved)


def _write_parts(path: Path, parts: list[bytes], sync: bool) -> None:
    files.write_atomic(path, b"[" + b",".join(parts) + b"]", sync=sync, notify=False)


async def pump_queue(
    engine: StreamsService,
    conn: MqttConnection,
    session: StoredSession,
    count: Callable[[str], None],
    sessions: Sessions,
) -> None:
    """A persistent session's queue to its connected client, from the first offset not acknowledged
    (what was sent before goes again with DUP), as many in flight as the client takes."""
    offset = session.acked
    redelivery_end = session.sent
    while conn.connected and not conn.closing:
        topic = engine.topic_store.topics.get(queue_topic(session.vpn, session.queue))  # VPN:name
        if topic is None:
            await asyncio.sleep(0.5)
            continue
        if len(conn.inflight) >= conn.receive_maximum:
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
            offset = event.offset + 1
            if conn.permissions is not None and conn.permissions.why_not_subscribe(body.event_type):
                count("queue_events_not_permitted")  # stored under permissions a reload narrowed since
                continue
            payload = body.data if isinstance(body.data, bytes) else msgspec.json.encode(body.data)
            conn.send_from_queue(
                event.offset,
                to_topic(body.event_type),
                payload,
                event.offset < redelivery_end,
                wrapped=NOT_WRAPPED not in (body.metadata or {}),
            )
        session.sent = max(session.sent, offset)
        if not conn.queue_offsets:
            session.acked = offset
        sessions.changed(session)
