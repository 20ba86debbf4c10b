"""The streams engine: rooms, partitioned topics, consumer groups and pub/sub over one data directory.

Layout of ``data_dir``::

    rooms/<room>/room.json              settings
    rooms/<room>/<base>.log|.index      the room's log
    topics/<topic>/topic.json           partitions, retention, segment size
    topics/<topic>/<partition>/...      one log per partition
    groups/<group>.json                 group snapshot (members, generation, assignment, offsets)
    groups/<group>.offsets              commits since the snapshot (records, replayed on start)

Everything runs on one asyncio loop; only fsync goes to a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec

from meshplane.config import default_state_dir
from meshplane.core import streamlog
from meshplane.core.groups import STRATEGIES, GroupCoordinator, GroupError, Strategy
from meshplane.core.streamlog import (
    RetentionPolicy,
    StoredEvent,
    decode_event,
    encode_event,
    encode_record,
    partition_for_key,
    resolve_start_offset,
    scan_records,
)
from meshplane.streams.errors import (
    BadRequest,
    Conflict,
    LimitReached,
    NotFound,
    OffsetOutOfRange,
    PayloadTooLarge,
    StreamError,
)
from meshplane.streams.log import PartitionLog, Segment

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}")


def check_name(kind: str, name: object) -> str:
    """Room, topic and group names become directory names: keep them to a safe alphabet."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise BadRequest(
            f"invalid {kind} name {name!r}: use 1-200 of A-Z a-z 0-9 _ . : - (not starting with . : -)"
        )
    return name


_ID_PREFIX = uuid.uuid4().hex[:12]
_id_counter = itertools.count()


def new_event_id() -> str:
    """Unique event ids without a uuid4 per event (which costs a system call): a random per-process
    prefix and a counter."""
    return f"{_ID_PREFIX}{next(_id_counter):012x}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class StreamsConfig:
    data_dir: Path = field(default_factory=lambda: default_state_dir() / "streams")
    fsync: FsyncPolicy = "interval"
    fsync_interval_ms: float = 10.0
    fsync_every_records: int = 0  # with "interval": also fsync once this many records wait (0: off)
    segment_bytes: int = 64 * 1024 * 1024
    max_payload_bytes: int = 1024 * 1024
    auto_create_rooms: bool = True
    room_max_events: int = 10_000
    room_retention_secs: float | None = 24 * 3600.0
    max_rooms: int = 100_000
    max_subscribers_per_room: int = 10_000
    room_inactive_timeout: float = 24 * 3600.0
    cleanup_interval: float = 1.0
    default_partitions: int = 3
    default_session_timeout: float = 30.0
    pubsub_queue_size: int = 10_000


# --- durability ------------------------------------------------------------------------------------


class Durability:
    """Group commit: appenders that need an fsync share one, run in a thread.

    ``interval``: data is on disk at most ``interval_ms`` after the first write not yet synced (Kafka's
    ``flush.ms``), sooner once ``every_records`` wait. Nothing runs while nothing is written.
    """

    def __init__(self, policy: FsyncPolicy, interval_ms: float, every_records: int) -> None:
        self.policy = policy
        self.interval = interval_ms / 1000
        self.every_records = every_records
        self._dirty: set[PartitionLog] = set()
        self._waiters: list[asyncio.Future[None]] = []
        self._pending_records = 0
        self._wake = asyncio.Event()  # something waits to be synced
        self._due = asyncio.Event()  # ... and it should be synced now
        self._task: asyncio.Task[None] | None = None
        self.fsyncs = 0
        self.fsync_seconds: list[float] = []  # drained by the metrics collector
        self.on_fsync: Callable[[float], None] | None = None

    def start(self) -> None:
        if self.policy != "never" and self._task is None:
            self._task = asyncio.create_task(self._run(), name="meshplane-fsync")

    async def written(self, log_: PartitionLog, records: int) -> None:
        """Call after an append; with ``always`` this returns once the append is on disk."""
        if self.policy == "never":
            return
        self._dirty.add(log_)
        self._wake.set()
        if self.policy == "always":
            future = asyncio.get_running_loop().create_future()
            self._waiters.append(future)
            self._due.set()
            await future
        else:
            self._pending_records += records
            if self.every_records and self._pending_records >= self.every_records:
                self._due.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if not self._due.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        await self._due.wait()
            self._wake.clear()
            self._due.clear()
            await self.flush()

    async def flush(self) -> None:
        logs = {lg for lg in self._dirty if not lg.closed}  # a deleted room or topic has nothing to sync
        self._dirty = set()
        waiters, self._waiters = self._waiters, []
        self._pending_records = 0
        if logs:
            # Duplicated descriptors: retention may close a segment while the thread syncs it.
            fds = [os.dup(lg.active.fd) for lg in logs]
            started = time.perf_counter()
            try:
                await asyncio.to_thread(_fsync_all, fds)
            except BaseException as exc:
                for future in waiters:
                    if not future.done():
                        future.set_exception(
                            exc if isinstance(exc, Exception) else OSError("fsync cancelled")
                        )
                raise
            if self.on_fsync:
                self.on_fsync(time.perf_counter() - started)
            self.fsyncs += 1
        for future in waiters:
            if not future.done():
                future.set_result(None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()


def _fsync_all(fds: list[int]) -> None:
    try:
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


# --- rooms -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamEvent:
    """An event as read back: its place (offset, partition) and what was published."""

    offset: int
    timestamp_ms: int
    body: StoredEvent
    size: int = 0
    partition: int | None = None
    rendered: dict[str, bytes] | None = None  # frames built once and sent to every pushed subscriber

    def render(self, kind: str, build: Callable[[StreamEvent], bytes]) -> bytes:
        if self.rendered is None:
            self.rendered = {}
        frame = self.rendered.get(kind)
        if frame is None:
            frame = self.rendered[kind] = build(self)
        return frame

    def room_json(self, room: str) -> dict[str, Any]:
        return {
            "id": self.body.id,
            "offset": self.offset,
            "room": room,
            "event": self.body.event_type,
            "event_type": self.body.event_type,
            "type": self.body.event_type,
            "data": self.body.data,
            "timestamp": self.timestamp_ms // 1000,
            "timestamp_ms": self.timestamp_ms,
            "metadata": self.body.metadata or {},
        }

    def topic_json(self, topic: str) -> dict[str, Any]:
        return {
            "id": self.body.id,
            "partition_id": self.partition,
            "offset": self.offset,
            "topic": topic,
            "event_type": self.body.event_type,
            "key": self.body.key,
            "data": self.body.data,
            "timestamp": self.timestamp_ms // 1000,
            "timestamp_ms": self.timestamp_ms,
            "metadata": self.body.metadata or {},
            "size_bytes": self.size,
        }


def _decode(record: streamlog.Record, partition: int | None = None) -> StreamEvent:
    return StreamEvent(
        record.offset, record.timestamp_ms, decode_event(record.payload), record.size, partition
    )


class Notifier:
    """Wakes readers waiting for new events (pushed subscribers, long polls)."""

    def __init__(self) -> None:
        self._events: set[asyncio.Event] = set()

    def waiter(self) -> asyncio.Event:
        event = asyncio.Event()
        self._events.add(event)
        return event

    def forget(self, event: asyncio.Event) -> None:
        self._events.discard(event)

    def notify(self) -> None:
        for event in self._events:
            event.set()

    def __len__(self) -> int:
        return len(self._events)


class Pusher(Protocol):
    def offer(self, event: StreamEvent) -> bool: ...

    def wake(self) -> None: ...


class Room:
    """A room: a log plus an in-memory ring of its most recent events (the retained history)."""

    def __init__(
        self,
        name: str,
        directory: Path,
        max_events: int,
        retention_secs: float | None,
        segment_bytes: int,
        created_at: float,
    ) -> None:
        self.name = name
        self.directory = directory
        self.max_events = max_events
        self.retention_secs = retention_secs
        self.created_at = created_at
        self.log = PartitionLog(
            directory, segment_bytes=segment_bytes, retention=RetentionPolicy(max_messages=max_events)
        )
        self.notifier = Notifier()  # long polls and other waiters
        self.pushers: set[Pusher] = set()  # WebSocket / SSE subscribers
        self.subscribers: dict[str, float] = {}  # subscriber id -> last seen
        self._ring: list[StreamEvent] = []
        self._head = 0
        self.last_event_at: float | None = None
        self.published = 0
        self._reload()

    def _reload(self) -> None:
        start = self.log.start_offset
        while start < self.log.next_offset:
            records = self.log.read(start, 10_000, 16 << 20)
            if not records:
                break
            self._ring.extend(_decode(r) for r in records)
            start = records[-1].offset + 1
        if self._ring:
            self.last_event_at = self._ring[-1].timestamp_ms / 1000
        self.trim(now_ms())

    def settings(self) -> dict[str, Any]:
        return {
            "max_events": self.max_events,
            "retention_secs": self.retention_secs,
            "created_at": self.created_at,
        }

    @property
    def next_offset(self) -> int:
        return self.log.next_offset

    @property
    def oldest(self) -> int:
        return self._ring[self._head].offset if self._head < len(self._ring) else self.next_offset

    def __len__(self) -> int:
        return len(self._ring) - self._head

    def last_event_ms(self) -> int:
        return self._ring[-1].timestamp_ms if self._ring else 0

    def append(self, events: list[StoredEvent], payloads: list[bytes], timestamp_ms: int) -> int:
        first = self.log.append(payloads, timestamp_ms)
        for i, event in enumerate(events):
            self._ring.append(StreamEvent(first + i, timestamp_ms, event))
        self.published += len(events)
        self.last_event_at = timestamp_ms / 1000
        self.trim(timestamp_ms)
        return first

    def broadcast(self, event: StreamEvent) -> int:
        """Hand a new event to pushed subscribers; returns how many were written at once."""
        written = 0
        for pusher in list(self.pushers):
            if pusher.offer(event):
                written += 1
            else:
                pusher.wake()
        self.notifier.notify()
        return written

    def trim(self, now: int) -> None:
        """Keep at most max_events, none older than retention_secs."""
        head = max(self._head, len(self._ring) - self.max_events)
        if self.retention_secs is not None:
            cutoff = now - self.retention_secs * 1000
            while head < len(self._ring) and self._ring[head].timestamp_ms < cutoff:
                head += 1
        self._head = head
        if self._head > 1024 and self._head * 2 > len(self._ring):
            del self._ring[: self._head]
            self._head = 0

    def read(self, from_offset: int, limit: int, to_offset: int | None = None) -> list[StreamEvent]:
        """Events from ``from_offset`` (already resolved and checked) on, up to ``to_offset`` inclusive."""
        start = self._head + (from_offset - self.oldest)
        stop = start + limit
        if to_offset is not None:
            stop = min(stop, self._head + (to_offset - self.oldest) + 1)
        return self._ring[max(start, self._head) : max(stop, start)]

    def resolve(self, from_offset: int | None) -> int:
        try:
            return resolve_start_offset(from_offset, self.oldest, self.next_offset)
        except streamlog.OffsetOutOfRange as exc:
            raise OffsetOutOfRange(exc.requested, exc.oldest, exc.newest) from None


# --- topics ----------------------------------------------------------------------------------------


class TopicSettings(msgspec.Struct):
    num_partitions: int
    replication_factor: int = 1
    retention: RetentionPolicy = msgspec.field(default_factory=RetentionPolicy)
    segment_bytes: int = 64 * 1024 * 1024
    created_at: float = 0.0


class Topic:
    def __init__(self, name: str, directory: Path, settings: TopicSettings) -> None:
        self.name = name
        self.directory = directory
        self.settings = settings
        self.partitions: list[PartitionLog] = []
        self.notifiers: list[Notifier] = []
        self.published: list[int] = []
        self.consumed: list[int] = []
        self._next_partition = 0
        self._open_partitions(settings.num_partitions)

    def _open_partitions(self, count: int) -> None:
        for p in range(len(self.partitions), count):
            s = self.settings
            self.partitions.append(
                PartitionLog(self.directory / str(p), segment_bytes=s.segment_bytes, retention=s.retention)
            )
            self.notifiers.append(Notifier())
            self.published.append(0)
            self.consumed.append(0)

    def grow(self, count: int) -> None:
        """More partitions (never fewer, as in Kafka: keyed events of existing keys may move)."""
        if count <= len(self.partitions):
            raise BadRequest(
                f"topic {self.name!r} has {len(self.partitions)} partitions: ask for more, not {count}"
            )
        self._open_partitions(count)
        self.settings.num_partitions = count

    def choose_partition(self, key: str | None, partition: int | None) -> int:
        count = len(self.partitions)
        if partition is not None:
            if not 0 <= partition < count:
                raise NotFound(
                    f"partition {partition} of topic {self.name!r} does not exist (0..{count - 1})"
                )
            return partition
        if key is not None:
            return partition_for_key(key, count)
        chosen = self._next_partition
        self._next_partition = (chosen + 1) % count
        return chosen

    def log_of(self, partition: int) -> PartitionLog:
        if not 0 <= partition < len(self.partitions):
            raise NotFound(
                f"partition {partition} of topic {self.name!r} does not exist (0..{len(self.partitions) - 1})"
            )
        return self.partitions[partition]

    def _checked(self, partition: int, from_offset: int) -> PartitionLog:
        plog = self.log_of(partition)
        start = plog.start_offset
        if from_offset < start or from_offset > plog.next_offset:
            newest = plog.next_offset - 1 if plog.next_offset > start else None
            raise OffsetOutOfRange(from_offset, start, newest)
        return plog

    def read(self, partition: int, from_offset: int, limit: int) -> list[StreamEvent]:
        events = [
            _decode(r, partition) for r in self._checked(partition, from_offset).read(from_offset, limit)
        ]
        self.consumed[partition] += len(events)
        return events

    def read_raw(self, partition: int, from_offset: int, max_bytes: int) -> bytes:
        """Record bytes as stored (see :func:`meshplane.core.streamlog.scan_records`)."""
        return self._checked(partition, from_offset).read_raw(from_offset, max_bytes)

    def raw_span(self, partition: int, from_offset: int, max_bytes: int) -> tuple[Segment, int, int] | None:
        """Where :meth:`read_raw`'s bytes are, for serving them with ``sendfile``."""
        return self._checked(partition, from_offset).raw_span(from_offset, max_bytes)

    def partition_stats(self, partition: int) -> dict[str, Any]:
        plog = self.partitions[partition]
        start, end = plog.start_offset, plog.next_offset
        return {
            "partition_id": partition,
            "topic": self.name,
            "message_count": end - start,
            "total_bytes": plog.size_bytes,
            "min_offset": start,
            "max_offset": end - 1 if end > start else None,
            "next_offset": end,
            "segments": len(plog.segments),
            "published": self.published[partition],
            "consumed": self.consumed[partition],
        }


# --- pub/sub ---------------------------------------------------------------------------------------


def topic_matches(pattern: str, topic: str) -> bool:
    """Synap's wildcards: ``*`` matches one dot-separated word, ``#`` any number (also zero)."""
    pat, words = pattern.split("."), topic.split(".")

    def match(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(words)
        if pat[i] == "#":
            return any(match(i + 1, k) for k in range(j, len(words) + 1))
        if j == len(words):
            return False
        return (pat[i] == "*" or pat[i] == words[j]) and match(i + 1, j + 1)

    return match(0, 0)


@dataclass
class PubSubListener:
    patterns: list[str]
    queue: asyncio.Queue[dict[str, Any]]
    dropped: int = 0


class PubSub:
    """Fire-and-forget topics with wildcard subscriptions (no history, as in Synap)."""

    def __init__(self, queue_size: int) -> None:
        self.queue_size = queue_size
        self.registered: dict[str, set[str]] = {}  # subscriber id -> patterns (HTTP-registered)
        self.listeners: dict[str, PubSubListener] = {}  # live WebSocket / SSE listeners
        self.topics: dict[str, int] = {}  # topic -> messages published
        self.published = 0
        self.delivered = 0
        self.dropped = 0

    def listen(self, listener_id: str, patterns: list[str]) -> PubSubListener:
        listener = PubSubListener(patterns, asyncio.Queue(self.queue_size))
        self.listeners[listener_id] = listener
        return listener

    def publish(self, topic: str, payload: Any, metadata: dict[str, str] | None) -> dict[str, Any]:
        message = {
            "type": "message",
            "message_id": uuid.uuid4().hex,
            "topic": topic,
            "payload": payload,
            "metadata": metadata or {},
            "timestamp": time.time(),
        }
        self.published += 1
        self.topics[topic] = self.topics.get(topic, 0) + 1
        matched = sum(1 for ps in self.registered.values() if any(topic_matches(p, topic) for p in ps))
        for listener in self.listeners.values():
            if any(topic_matches(p, topic) for p in listener.patterns):
                matched += 1
                try:
                    listener.queue.put_nowait(message)
                    self.delivered += 1
                except asyncio.QueueFull:
                    listener.dropped += 1
                    self.dropped += 1
        return {"message_id": message["message_id"], "topic": topic, "subscribers_matched": matched}


# --- the engine ------------------------------------------------------------------------------------


class StreamEngine:
    def __init__(self, config: StreamsConfig | None = None) -> None:
        self.config = config or StreamsConfig()
        self.root = Path(self.config.data_dir)
        self.rooms: dict[str, Room] = {}
        self.topics: dict[str, Topic] = {}
        self.groups: dict[str, GroupCoordinator] = {}
        self._offset_fds: dict[str, int] = {}
        self._offset_seq: dict[str, int] = {}
        self.pubsub = PubSub(self.config.pubsub_queue_size)
        self.durability = Durability(
            self.config.fsync, self.config.fsync_interval_ms, self.config.fsync_every_records
        )
        self.group_notifier = Notifier()
        self.idempotency = IdempotencyTable()
        self._cleanup: asyncio.Task[None] | None = None
        self.counters: dict[str, int] = {
            "events_published": 0,
            "bytes_published": 0,
            "events_consumed": 0,
            "commits": 0,
            "commits_rejected": 0,
            "duplicates_skipped": 0,
            "rebalances": 0,
        }
        self.ready = False

    # --- lifecycle -----------------------------------------------------------------------------------

    def open(self) -> None:
        """Load everything under the data directory (recovering torn logs)."""
        for sub in ("rooms", "topics", "groups"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for path in sorted((self.root / "rooms").glob("*/room.json")):
            settings = json.loads(path.read_text())
            name = path.parent.name
            self.rooms[name] = Room(
                name,
                path.parent,
                int(settings["max_events"]),
                settings.get("retention_secs"),
                self.config.segment_bytes,
                float(settings.get("created_at", time.time())),
            )
        for path in sorted((self.root / "topics").glob("*/topic.json")):
            settings = msgspec.json.decode(path.read_bytes(), type=TopicSettings)
            self.topics[path.parent.name] = Topic(path.parent.name, path.parent, settings)
        self.idempotency.open(self.root / "idempotency.log")
        now = time.monotonic()
        for path in sorted((self.root / "groups").glob("*.json")):
            group = GroupCoordinator.restore(json.loads(path.read_text()), now)
            self._replay_commits(group)
            self.groups[group.group_id] = group
            self._save_group(group)  # folds the replayed commits into the snapshot
        self.ready = True

    async def start(self) -> None:
        self.open()
        self.durability.start()
        self._cleanup = asyncio.create_task(self._cleanup_loop(), name="meshplane-streams-cleanup")

    async def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup.cancel()
            await asyncio.gather(self._cleanup, return_exceptions=True)
        await self.durability.close()
        for room in self.rooms.values():
            room.log.sync()
            room.log.close()
        for topic in self.topics.values():
            for plog in topic.partitions:
                plog.sync()
                plog.close()
        self.idempotency.close()
        for fd in self._offset_fds.values():
            os.close(fd)
        self._offset_fds.clear()

    async def _cleanup_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.cleanup_interval)
            try:
                self.maintain(time.monotonic())
            except Exception:
                log.exception("streams maintenance failed")

    def maintain(self, monotonic_now: float) -> None:
        """Retention, room expiry, inactive rooms and group session timeouts."""
        wall_ms = now_ms()
        for room in list(self.rooms.values()):
            room.trim(wall_ms)
            room.log.apply_retention(wall_ms, keep_from=room.oldest)
            idle_since = room.last_event_at or room.created_at
            if (
                not room.pushers
                and not room.subscribers
                and time.time() - idle_since > self.config.room_inactive_timeout
            ):
                log.info("room %s inactive since %.0f s: removed", room.name, time.time() - idle_since)
                self.delete_room(room.name)
        for topic in self.topics.values():
            for plog in topic.partitions:
                plog.apply_retention(wall_ms)
        for group in self.groups.values():
            if group.expire(monotonic_now) is not None:
                self.counters["rebalances"] += 1
                self._save_group(group)
                self.group_notifier.notify()

    # --- rooms ---------------------------------------------------------------------------------------

    def create_room(
        self,
        name: str,
        max_events: int | None = None,
        retention_secs: float | None = None,
        *,
        exist_ok: bool = False,
    ) -> tuple[Room, bool]:
        check_name("room", name)
        if name in self.rooms:
            if exist_ok:
                return self.rooms[name], False
            raise Conflict(f"room {name!r} already exists")
        if len(self.rooms) >= self.config.max_rooms:
            raise LimitReached(f"room limit reached ({self.config.max_rooms} rooms)")
        max_events = self.config.room_max_events if max_events is None else max_events
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise BadRequest(f"max_events must be a positive integer, not {max_events!r}")
        directory = self.root / "rooms" / name
        room = Room(
            name,
            directory,
            max_events,
            self.config.room_retention_secs if retention_secs is None else retention_secs,
            self.config.segment_bytes,
            time.time(),
        )
        _write_atomic(directory / "room.json", json.dumps(room.settings()).encode())
        self.rooms[name] = room
        return room, True

    def room(self, name: str, *, create: bool = False) -> Room:
        found = self.rooms.get(check_name("room", name))
        if found is not None:
            return found
        if create and self.config.auto_create_rooms:
            return self.create_room(name, exist_ok=True)[0]
        raise NotFound(f"room {name!r} not found")

    def delete_room(self, name: str) -> bool:
        room = self.rooms.pop(check_name("room", name), None)
        if room is None:
            return False
        room.log.delete()
        (room.directory / "room.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            room.directory.rmdir()
        room.notifier.notify()
        for pusher in room.pushers:  # they see the room is gone
            pusher.wake()
        return True

    async def publish_room(
        self,
        name: str,
        event_type: str,
        data: Any,
        metadata: dict[str, str] | None = None,
    ) -> tuple[Room, StreamEvent]:
        room = self.room(name, create=True)
        body = StoredEvent(new_event_id(), event_type, data, None, metadata)
        payload = self._encode_checked(body)
        timestamp = now_ms()
        first = room.append([body], [payload], timestamp)
        self._count_publish(1, len(payload))
        await self.durability.written(room.log, 1)
        event = room.read(first, 1)[0] if first >= room.oldest else StreamEvent(first, timestamp, body)
        room.broadcast(event)
        return room, event

    def read_room(
        self, name: str, from_offset: int | None, limit: int, to_offset: int | None = None
    ) -> tuple[Room, list[StreamEvent]]:
        room = self.room(name)
        start = room.resolve(from_offset)
        events = room.read(start, limit, to_offset)
        self.counters["events_consumed"] += len(events)
        return room, events

    def room_stats(self, name: str) -> dict[str, Any]:
        room = self.room(name)
        oldest, nxt = room.oldest, room.next_offset
        return {
            "name": name,
            "room": name,
            "message_count": len(room),
            "min_offset": oldest,
            "max_offset": nxt - 1 if nxt > oldest else None,
            "next_offset": nxt,
            "subscriber_count": len(room.subscribers),
            "live_subscribers": len(room.pushers),
            "published": room.published,
            "max_events": room.max_events,
            "retention_secs": room.retention_secs,
            "total_bytes": room.log.size_bytes,
            "created_at": room.created_at,
            "last_event_at": room.last_event_at,
        }

    def touch_subscriber(self, room: Room, subscriber_id: str) -> None:
        if (
            subscriber_id not in room.subscribers
            and len(room.subscribers) >= self.config.max_subscribers_per_room
        ):
            raise LimitReached(
                f"room {room.name!r} has {self.config.max_subscribers_per_room} subscribers (the limit)"
            )
        room.subscribers[subscriber_id] = time.time()

    # --- topics --------------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        num_partitions: int | None = None,
        replication_factor: int = 1,
        retention: RetentionPolicy | None = None,
        segment_bytes: int | None = None,
    ) -> Topic:
        check_name("topic", name)
        if name in self.topics:
            raise Conflict(f"topic {name!r} already exists")
        partitions = self.config.default_partitions if num_partitions is None else num_partitions
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 10_000:
            raise BadRequest(f"num_partitions must be an integer in 1..10000, not {partitions!r}")
        if replication_factor != 1:
            raise BadRequest("replication_factor must be 1: meshplane streams run on one node")
        segment = self.config.segment_bytes if segment_bytes is None else segment_bytes
        if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1024:
            raise BadRequest(f"segment_bytes must be an integer >= 1024, not {segment!r}")
        settings = TopicSettings(
            partitions, replication_factor, retention or RetentionPolicy(), segment, time.time()
        )
        directory = self.root / "topics" / name
        topic = Topic(name, directory, settings)
        _write_atomic(directory / "topic.json", msgspec.json.encode(settings))
        self.topics[name] = topic
        return topic

    def topic(self, name: str) -> Topic:
        found = self.topics.get(check_name("topic", name))
        if found is None:
            raise NotFound(f"topic {name!r} not found")
        return found

    def add_partitions(self, name: str, count: int) -> Topic:
        topic = self.topic(name)
        if count > 10_000:
            raise BadRequest("num_partitions must be <= 10000")
        topic.grow(count)
        _write_atomic(topic.directory / "topic.json", msgspec.json.encode(topic.settings))
        for group in self.groups.values():
            if group.topic == name:
                group.resize(count, time.monotonic())
                self.group_changed(group)
        return topic

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.pop(check_name("topic", name), None)
        if topic is None:
            return False
        for plog in topic.partitions:
            plog.delete()
        (topic.directory / "topic.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            topic.directory.rmdir()
        return True

    async def publish_topic(
        self,
        name: str,
        events: list[StoredEvent],
        partition: int | None = None,
        idempotency_key: str | None = None,
    ) -> list[tuple[int, int]]:
        """Append events (each routed by key, round-robin or ``partition``); returns (partition, offset)s.

        A request repeated with the same ``idempotency_key`` appends nothing and gets the first answer.
        """
        topic = self.topic(name)
        if idempotency_key is not None:
            seen = self.idempotency.get(f"{name}/{idempotency_key}")
            if seen is not None:
                self.counters["duplicates_skipped"] += len(events)
                return seen
        encoded = [self._encode_checked(e) for e in events]  # all checked before anything is appended
        total = sum(len(e) for e in encoded)
        by_partition: dict[int, list[bytes]] = {}
        places: list[tuple[int, int]] = []
        for event, payload in zip(events, encoded, strict=True):
            p = topic.choose_partition(event.key, partition)
            by_partition.setdefault(p, []).append(payload)
            places.append((p, len(by_partition[p]) - 1))
        timestamp = now_ms()
        firsts: dict[int, int] = {}
        for p, batch in by_partition.items():
            firsts[p] = topic.partitions[p].append(batch, timestamp)
            topic.published[p] += len(batch)
            topic.notifiers[p].notify()
        self._count_publish(len(events), total)
        result = [(p, firsts[p] + i) for p, i in places]
        if idempotency_key is not None:  # before any await: a concurrent retry must see it
            self.idempotency.put(f"{name}/{idempotency_key}", result)
        for p, batch in by_partition.items():
            await self.durability.written(topic.partitions[p], len(batch))
        return result

    # --- consumer groups -----------------------------------------------------------------------------

    def create_group(
        self,
        group_id: str,
        topic: str,
        partition_count: int | None = None,
        strategy: str = "round_robin",
        session_timeout: float | None = None,
    ) -> GroupCoordinator:
        check_name("group", group_id)
        if group_id in self.groups:
            raise Conflict(f"consumer group {group_id!r} already exists")
        found = self.topics.get(topic)
        if partition_count is None:
            if found is None:
                raise NotFound(f"topic {topic!r} not found (create it, or pass partition_count)")
            partition_count = len(found.partitions)
        elif found is not None and partition_count != len(found.partitions):
            raise BadRequest(f"topic {topic!r} has {len(found.partitions)} partitions, not {partition_count}")
        if strategy not in STRATEGIES:
            raise BadRequest(f"unknown strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
        strategy_name: Strategy = strategy  # type: ignore[assignment]
        try:
            group = GroupCoordinator(
                group_id,
                topic,
                partition_count,
                strategy=strategy_name,
                session_timeout=session_timeout or self.config.default_session_timeout,
            )
        except GroupError as exc:
            raise BadRequest(str(exc)) from None
        self.groups[group_id] = group
        self._save_group(group)
        return group

    def group(self, group_id: str) -> GroupCoordinator:
        found = self.groups.get(check_name("group", group_id))
        if found is None:
            raise NotFound(f"consumer group {group_id!r} not found")
        return found

    def delete_group(self, group_id: str) -> bool:
        group = self.groups.pop(check_name("group", group_id), None)
        if group is None:
            return False
        fd = self._offset_fds.pop(group_id, None)
        if fd is not None:
            os.close(fd)
        for suffix in (".json", ".offsets"):
            (self.root / "groups" / f"{group_id}{suffix}").unlink(missing_ok=True)
        return True

    def group_changed(self, group: GroupCoordinator) -> None:
        self.counters["rebalances"] += 1
        self._save_group(group)
        self.group_notifier.notify()

    def commit(
        self, group_id: str, partition: int, offset: int, member_id: str | None, generation: int | None
    ) -> None:
        group = self.group(group_id)
        before = group.generation
        try:
            group.commit(partition, offset, time.monotonic(), member_id, generation)
        except GroupError:
            self.counters["commits_rejected"] += 1
            if group.generation != before:
                self.group_changed(group)
            raise
        self.counters["commits"] += 1
        self._append_commit(group, partition, offset)

    def _save_group(self, group: GroupCoordinator) -> None:
        path = self.root / "groups" / f"{group.group_id}.json"
        _write_atomic(path, json.dumps(group.snapshot()).encode())
        fd = self._offset_fds.pop(group.group_id, None)
        if fd is not None:
            os.close(fd)
        (self.root / "groups" / f"{group.group_id}.offsets").unlink(missing_ok=True)
        self._offset_seq[group.group_id] = 0

    def _append_commit(self, group: GroupCoordinator, partition: int, offset: int) -> None:
        """Commits go to an append-only file (a write, no fsync): cheap enough for sub-ms commits."""
        fd = self._offset_fds.get(group.group_id)
        if fd is None:
            path = self.root / "groups" / f"{group.group_id}.offsets"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._offset_fds[group.group_id] = fd
        seq = self._offset_seq.get(group.group_id, 0)
        os.write(fd, encode_record(seq, now_ms(), msgspec.msgpack.encode((partition, offset))))
        self._offset_seq[group.group_id] = seq + 1
        if seq >= 10_000:
            self._save_group(group)  # compact

    def _replay_commits(self, group: GroupCoordinator) -> None:
        path = self.root / "groups" / f"{group.group_id}.offsets"
        if not path.exists():
            return
        result = scan_records(path.read_bytes(), expected_offset=0)
        for record in result.records:
            partition, offset = msgspec.msgpack.decode(record.payload)
            group.committed[int(partition)] = int(offset)

    # --- helpers -------------------------------------------------------------------------------------

    def _encode_checked(self, event: StoredEvent) -> bytes:
        payload = encode_event(event)
        limit = self.config.max_payload_bytes
        if len(payload) > limit:
            raise PayloadTooLarge(f"event of {len(payload)} bytes is larger than the limit of {limit} bytes")
        return payload

    def _count_publish(self, events: int, size: int) -> None:
        self.counters["events_published"] += events
        self.counters["bytes_published"] += size

    def lag(self) -> Iterable[tuple[str, int, int]]:
        """(group, partition, lag) for every group of an existing topic."""
        for group in self.groups.values():
            topic = self.topics.get(group.topic)
            if topic is None:
                continue
            for p, plog in enumerate(topic.partitions[: group.partitions]):
                committed = group.committed.get(p, plog.start_offset)
                yield group.group_id, p, max(0, plog.next_offset - committed)


class IdempotencyTable:
    """The answers to the last ``capacity`` idempotent publishes, kept in a file across restarts."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, list[tuple[int, int]]] = OrderedDict()
        self._fd: int | None = None
        self._path: Path | None = None
        self._seq = 0

    def open(self, path: Path) -> None:
        self._path = path
        if path.exists():
            for record in scan_records(path.read_bytes(), expected_offset=0).records:
                key, places = msgspec.msgpack.decode(record.payload)
                self._remember(key, [(int(p), int(o)) for p, o in places])
        self._rewrite()

    def get(self, key: str) -> list[tuple[int, int]] | None:
        return self.entries.get(key)

    def put(self, key: str, places: list[tuple[int, int]]) -> None:
        self._remember(key, places)
        if self._fd is not None:
            os.write(self._fd, encode_record(self._seq, now_ms(), msgspec.msgpack.encode((key, places))))
            self._seq += 1
            if self._seq > 2 * self.capacity:
                self._rewrite()

    def _remember(self, key: str, places: list[tuple[int, int]]) -> None:
        self.entries[key] = places
        self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def _rewrite(self) -> None:
        """Compact the file to the entries kept."""
        if self._path is None:
            return
        self.close()
        records = [
            encode_record(i, 0, msgspec.msgpack.encode((key, places)))
            for i, (key, places) in enumerate(self.entries.items())
        ]
        _write_atomic(self._path, b"".join(records))
        self._seq = len(records)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


__all__ = ["StreamEngine", "StreamError", "StreamsConfig"]
