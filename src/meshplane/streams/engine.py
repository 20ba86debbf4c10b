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
    partition_for_key,
    resolve_start_offset,
)
from meshplane.streams.errors import (
    BadRequest,
    Conflict,
    CorruptRecords,
    LimitReached,
    NotFound,
    OffsetOutOfRange,
    PayloadTooLarge,
    StorageError,
    StreamError,
    storage_error,
)
from meshplane.streams.files import FilePool, RecordFile, write_atomic
from meshplane.streams.log import PartitionLog, Segment
from meshplane.streams.pubsub import PubSub, PubSubLimits

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
    max_rooms: int = 10_000
    room_max_events_limit: int = 1_000_000  # the largest max_events a room may ask for
    room_max_bytes: int = 16 * 1024 * 1024  # each room's in-memory history
    room_memory_bytes: int = 512 * 1024 * 1024  # all rooms' histories together
    max_topics: int = 10_000
    max_partitions: int = 100_000  # all topics' partitions together
    max_open_files: int | None = None  # segment files open at once (None: half of RLIMIT_NOFILE)
    idempotency_keys: int = 100_000  # idempotent publishes remembered ...
    idempotency_bytes: int = 64 * 1024 * 1024  # ... in at most this much memory ...
    idempotency_ttl_secs: float = 7 * 24 * 3600.0  # ... for at most this long
    max_subscribers_per_room: int = 10_000
    room_inactive_timeout: float = 24 * 3600.0
    cleanup_interval: float = 1.0
    # Sealed segments are trusted up to their index when the server starts; their crcs are then
    # checked in the background, this many bytes per cleanup cycle (0: never).
    verify_bytes_per_cycle: int = 4 * 1024 * 1024
    default_partitions: int = 3
    default_session_timeout: float = 30.0
    pubsub_queue_size: int = 10_000
    # The HTTP side: a connection that sends no whole request (headers) within idle_timeout_secs, or
    # not its whole body within body_timeout_secs, is closed; pushed SSE subscribers get a comment
    # every push_keepalive_secs, so one that vanished is noticed on an idle room.
    idle_timeout_secs: float = 15.0
    body_timeout_secs: float = 30.0
    push_keepalive_secs: float = 15.0


# --- durability ------------------------------------------------------------------------------------


class Syncable(Protocol):
    """What the durability loop fsyncs: a partition log or a small record file."""

    closed: bool

    def sync_fd(self) -> int: ...


class Durability:
    """Group commit: appenders that need an fsync share one, run in a thread.

    ``interval``: data is on disk at most ``interval_ms`` after the first write not yet synced (Kafka's
    ``flush.ms``), sooner once ``every_records`` wait. Nothing runs while nothing is written. A failed
    fsync fails the writes waiting on that file (503) and is counted; the others are acknowledged.
    """

    def __init__(self, policy: FsyncPolicy, interval_ms: float, every_records: int) -> None:
        self.policy = policy
        self.interval = interval_ms / 1000
        self.every_records = every_records
        self._dirty: dict[Syncable, list[asyncio.Future[None]]] = {}
        self._pending_records = 0
        self._wake = asyncio.Event()  # something waits to be synced
        self._due = asyncio.Event()  # ... and it should be synced now
        self._task: asyncio.Task[None] | None = None
        self.fsyncs = 0
        self.fsync_errors = 0
        self.on_fsync: Callable[[float], None] | None = None

    def start(self) -> None:
        if self.policy != "never" and self._task is None:
            self._task = asyncio.create_task(self._run(), name="meshplane-fsync")

    async def written(self, *targets: Syncable, records: int = 1) -> None:
        """Call after a write; with ``always`` this returns once it is on disk (or raises StorageError)."""
        if self.policy == "never":
            return
        self._wake.set()
        if self.policy == "always":
            future = asyncio.get_running_loop().create_future()
            for target in targets:
                self._dirty.setdefault(target, []).append(future)
            self._due.set()
            await future
        else:
            for target in targets:
                self._dirty.setdefault(target, [])
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
        dirty, self._dirty = self._dirty, {}
        self._pending_records = 0
        targets = [t for t in dirty if not t.closed]  # a deleted room or topic has nothing to sync
        failed: dict[Syncable, str] = {}
        if targets:
            # Duplicated descriptors: retention may close a segment while the thread syncs it.
            fds: list[tuple[Syncable, int]] = []
            for target in targets:
                try:
                    fds.append((target, os.dup(target.sync_fd())))
                except OSError as exc:
                    failed[target] = exc.strerror or str(exc)
            started = time.perf_counter()
            try:
                errors = await asyncio.to_thread(_fsync_each, [fd for _, fd in fds])
            except BaseException:
                for futures in dirty.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(StorageError("fsync cancelled: the server is stopping"))
                raise
            failed.update({target: error for (target, _), error in zip(fds, errors, strict=True) if error})
            if self.on_fsync:
                self.on_fsync(time.perf_counter() - started)
            self.fsyncs += 1
        if failed:
            self.fsync_errors += len(failed)
            log.error("fsync failed: %s", "; ".join(f"{t}: {e}" for t, e in failed.items()))
        # A write waiting on several files fails if any of them failed.
        for target, error in failed.items():
            for future in dirty.get(target, ()):
                if not future.done():
                    future.set_exception(
                        StorageError(
                            f"fsync failed ({error}): the write is not known to be on disk; "
                            "retry it (with an idempotency key, a retry cannot duplicate it)"
                        )
                    )
        for futures in dirty.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()


def _fsync_each(fds: list[int]) -> list[str | None]:
    """fsync each descriptor (and close it); the error of each, or None."""
    errors: list[str | None] = []
    for fd in fds:
        try:
            os.fsync(fd)
            errors.append(None)
        except OSError as exc:
            errors.append(exc.strerror or str(exc))
        finally:
            os.close(fd)
    return errors


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
        files: FilePool | None = None,
        max_bytes: Callable[[], int] = lambda: 1 << 62,
    ) -> None:
        self.name = name
        self.directory = directory
        self.max_events = max_events
        self.retention_secs = retention_secs
        self.created_at = created_at
        self.max_bytes = max_bytes  # the in-memory history's byte bound, which shrinks as rooms are added
        self.log = PartitionLog(
            directory,
            segment_bytes=segment_bytes,
            retention=RetentionPolicy(max_messages=max_events),
            files=files,
        )
        self.notifier = Notifier()  # long polls and other waiters
        self.pushers: set[Pusher] = set()  # WebSocket / SSE subscribers
        self.subscribers: dict[str, float] = {}  # subscriber id -> last seen
        self._ring: list[StreamEvent] = []
        self._head = 0
        self.ring_bytes = 0  # of the events from _head on
        self.last_event_at: float | None = None
        self.published = 0
        self._reload()

    def _reload(self) -> None:
        start = self.log.start_offset
        while start < self.log.next_offset:
            try:
                records = self.log.read(start, 10_000, 16 << 20)
            except CorruptRecords as exc:
                # The history is served from memory by offset arithmetic: keep what follows the hole.
                self._ring.clear()
                self.ring_bytes = 0
                start = exc.next_offset
                continue
            if not records:
                break
            for r in records:
                self._ring.append(_decode(r))
                self.ring_bytes += r.size
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
        for i, (event, payload) in enumerate(zip(events, payloads, strict=True)):
            size = len(payload) + streamlog.HEADER_SIZE
            self._ring.append(StreamEvent(first + i, timestamp_ms, event, size))
            self.ring_bytes += size
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
        """Keep at most max_events and max_bytes (but the newest event), none older than retention_secs."""
        head = self._head
        while len(self._ring) - head > self.max_events:
            self.ring_bytes -= self._ring[head].size
            head += 1
        cutoff = now - self.retention_secs * 1000 if self.retention_secs is not None else None
        limit = self.max_bytes()
        while head < len(self._ring) - 1 and (
            self.ring_bytes > limit or (cutoff is not None and self._ring[head].timestamp_ms < cutoff)
        ):
            self.ring_bytes -= self._ring[head].size
            head += 1
        if head == len(self._ring) - 1 and cutoff is not None and self._ring[head].timestamp_ms < cutoff:
            self.ring_bytes -= self._ring[head].size
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
    # Which life of the name this is: a topic deleted and created again is another incarnation, and
    # nothing of the old one (idempotency answers) applies to it.
    incarnation: str = ""


class Topic:
    def __init__(
        self, name: str, directory: Path, settings: TopicSettings, files: FilePool | None = None
    ) -> None:
        self.name = name
        self.directory = directory
        self.settings = settings
        self.files = files
        self.partitions: list[PartitionLog] = []
        self.notifiers: list[Notifier] = []
        self.published: list[int] = []
        self.consumed: list[int] = []
        self._next_partition = 0
        self._open_partitions(settings.num_partitions)

    def _open_partitions(self, count: int) -> None:
        """Open partitions up to ``count``; if one fails, those opened here are removed again."""
        before = len(self.partitions)
        try:
            self._open_more(count)
        except BaseException:
            for plog in self.partitions[before:]:
                plog.delete()
            del self.partitions[before:], self.notifiers[before:]
            del self.published[before:], self.consumed[before:]
            raise

    def _open_more(self, count: int) -> None:
        for p in range(len(self.partitions), count):
            s = self.settings
            self.partitions.append(
                PartitionLog(
                    self.directory / str(p),
                    segment_bytes=s.segment_bytes,
                    retention=s.retention,
                    files=self.files,
                )
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


# --- the engine ------------------------------------------------------------------------------------


class StreamEngine:
    def __init__(self, config: StreamsConfig | None = None) -> None:
        self.config = config or StreamsConfig()
        self.root = Path(self.config.data_dir)
        self.rooms: dict[str, Room] = {}
        self.topics: dict[str, Topic] = {}
        self.groups: dict[str, GroupCoordinator] = {}
        self._commit_files: dict[str, RecordFile] = {}
        self.files = FilePool(self.config.max_open_files)
        self.problems: list[str] = []  # what was found wrong in the data directory, and set aside
        self.pubsub = PubSub(PubSubLimits(queue_messages=self.config.pubsub_queue_size))
        self.durability = Durability(
            self.config.fsync, self.config.fsync_interval_ms, self.config.fsync_every_records
        )
        self.group_notifier = Notifier()
        self.idempotency = IdempotencyTable(
            self.config.idempotency_keys, self.config.idempotency_bytes, self.config.idempotency_ttl_secs
        )
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
        """Load everything under the data directory (recovering torn logs). A metadata file that
        cannot be read is set aside (``<name>.corrupt-<time>``) and reported; the server starts."""
        try:
            self._open()
        except OSError as exc:
            raise storage_error(exc, f"opening the data directory {self.root}") from exc

    def _open(self) -> None:
        for sub in ("rooms", "topics", "groups"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for directory in sorted(p for p in (self.root / "rooms").iterdir() if p.is_dir()):
            self._load_room(directory)
        for directory in sorted(p for p in (self.root / "topics").iterdir() if p.is_dir()):
            self._load_topic(directory)
        self.idempotency.open(self.root / "idempotency.log", sync=self.config.fsync != "never")
        now = time.monotonic()
        for path in sorted((self.root / "groups").glob("*.json")):
            try:
                group = GroupCoordinator.restore(json.loads(path.read_bytes()), now)
            except (ValueError, KeyError, TypeError) as exc:
                self._set_aside(path, f"consumer group file {path.name} is unreadable ({exc})")
                continue
            self._replay_commits(group)
            self.groups[group.group_id] = group
            try:
                self._save_group(group)  # folds the replayed commits into the snapshot
            except OSError as exc:  # a full disk: the commit file stays as it is, and is appended to
                log.warning("consumer group %s: not compacted (%s)", group.group_id, exc)
        self.ready = True

    def _load_room(self, directory: Path) -> None:
        path = directory / "room.json"
        settings: dict[str, Any] = {}
        try:
            settings = json.loads(path.read_bytes())
            if not isinstance(settings, dict):
                raise ValueError("not an object")
            max_events = int(settings["max_events"])
        except FileNotFoundError:
            if not any(directory.glob("*.log")):
                return  # a room deleted while the server stopped halfway
            self._report(f"room {directory.name}: room.json is missing; defaults used")
            max_events = self.config.room_max_events
        except (ValueError, KeyError, TypeError) as exc:
            self._set_aside(path, f"room {directory.name}: room.json is unreadable ({exc}); defaults used")
            settings, max_events = {}, self.config.room_max_events
        room = self._new_room(
            directory.name,
            max_events,
            settings.get("retention_secs", self.config.room_retention_secs),
            float(settings.get("created_at") or time.time()),
        )
        if not path.exists():
            write_atomic(path, json.dumps(room.settings()).encode())

    def _load_topic(self, directory: Path) -> None:
        path = directory / "topic.json"
        partitions = sum(1 for p in directory.iterdir() if p.is_dir() and p.name.isdigit())
        try:
            settings = msgspec.json.decode(path.read_bytes(), type=TopicSettings)
        except FileNotFoundError:
            if not partitions:
                return
            self._report(f"topic {directory.name}: topic.json is missing; {partitions} partitions found")
            settings = TopicSettings(partitions, segment_bytes=self.config.segment_bytes)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._set_aside(path, f"topic {directory.name}: topic.json is unreadable ({exc})")
            settings = TopicSettings(max(partitions, 1), segment_bytes=self.config.segment_bytes)
        changed = not settings.incarnation or not path.exists() or partitions > settings.num_partitions
        settings.num_partitions = max(settings.num_partitions, partitions)
        settings.incarnation = settings.incarnation or uuid.uuid4().hex
        self.topics[directory.name] = Topic(directory.name, directory, settings, self.files)
        if changed:
            try:
                write_atomic(path, msgspec.json.encode(settings))
            except OSError as exc:
                self._report(f"topic {directory.name}: topic.json not rewritten ({exc})")

    def _set_aside(self, path: Path, problem: str) -> None:
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(f"{path.name}.corrupt-{time.time_ns()}"))
        self._report(problem + f"; the file was set aside as {path.name}.corrupt-*")

    def _report(self, problem: str) -> None:
        log.error("streams data %s: %s", self.root, problem)
        self.problems.append(problem)
        del self.problems[:-100]

    def limits(self) -> dict[str, tuple[int, int]]:
        """Each bounded resource: (in use, limit)."""
        c = self.config
        return {
            "topics": (len(self.topics), c.max_topics),
            "partitions": (sum(len(t.partitions) for t in self.topics.values()), c.max_partitions),
            "rooms": (len(self.rooms), c.max_rooms),
            "room_memory_bytes": (sum(r.ring_bytes for r in self.rooms.values()), c.room_memory_bytes),
            "open_files": (len(self.files), self.files.capacity),
            "idempotency_keys": (len(self.idempotency.entries), c.idempotency_keys),
            "idempotency_bytes": (self.idempotency.bytes, c.idempotency_bytes),
            "pubsub_registrations": (len(self.pubsub.registered), self.pubsub.limits.registered_subscribers),
            "pubsub_listeners": (len(self.pubsub.listeners), self.pubsub.limits.listeners),
        }

    def storage_problems(self) -> list[str]:
        """What recovery found and set aside, in metadata and in every log."""
        found = list(self.problems)
        for room in self.rooms.values():
            found.extend(f"room {room.name}: {p}" for p in room.log.problems)
        for topic in self.topics.values():
            for n, plog in enumerate(topic.partitions):
                found.extend(f"topic {topic.name}/{n}: {p}" for p in plog.problems)
        return found

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
        for commits in self._commit_files.values():
            commits.close()
        self._commit_files.clear()
        self.files.close()

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
        budget = self.config.verify_bytes_per_cycle
        for topic in self.topics.values():
            for plog in topic.partitions:
                plog.apply_retention(wall_ms)
                if budget > 0:
                    budget -= plog.verify_step(budget)
        self.idempotency.expire(time.time())
        self.pubsub.expire(monotonic_now)
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
        most = self.config.room_max_events_limit
        if isinstance(max_events, bool) or not isinstance(max_events, int) or not 1 <= max_events <= most:
            raise BadRequest(f"max_events must be an integer in 1..{most}, not {max_events!r}")
        room = self._new_room(
            name,
            max_events,
            self.config.room_retention_secs if retention_secs is None else retention_secs,
            time.time(),
        )
        try:
            write_atomic(room.directory / "room.json", json.dumps(room.settings()).encode())
        except OSError as exc:
            self.rooms.pop(name, None)
            room.log.delete()
            raise storage_error(exc, f"creating room {name!r}") from exc
        return room, True

    def _new_room(self, name: str, max_events: int, retention_secs: float | None, created: float) -> Room:
        room = Room(
            name,
            self.root / "rooms" / name,
            max_events,
            retention_secs,
            self.config.segment_bytes,
            created,
            self.files,
            self._room_byte_limit,
        )
        self.rooms[name] = room
        return room

    def _room_byte_limit(self) -> int:
        """Each room's share of the rooms' memory: rooms' histories together stay within the budget."""
        return min(self.config.room_max_bytes, self.config.room_memory_bytes // max(1, len(self.rooms)))

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
        body = StoredEvent(new_event_id(), event_type, data, None, metadata)
        payload = self._encode_checked(body)  # before the room is made: a refused event makes none
        room = self.room(name, create=True)
        timestamp = now_ms()
        first = room.append([body], [payload], timestamp)
        self._count_publish(1, len(payload))
        await self.durability.written(room.log)
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
        if len(self.topics) >= self.config.max_topics:
            raise LimitReached(f"topic limit reached ({self.config.max_topics} topics)")
        partitions = self.config.default_partitions if num_partitions is None else num_partitions
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 10_000:
            raise BadRequest(f"num_partitions must be an integer in 1..10000, not {partitions!r}")
        self._check_partition_budget(partitions)
        if replication_factor != 1:
            raise BadRequest("replication_factor must be 1: meshplane streams run on one node")
        segment = self.config.segment_bytes if segment_bytes is None else segment_bytes
        if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1024:
            raise BadRequest(f"segment_bytes must be an integer >= 1024, not {segment!r}")
        settings = TopicSettings(
            partitions,
            replication_factor,
            retention or RetentionPolicy(),
            segment,
            time.time(),
            incarnation=uuid.uuid4().hex,
        )
        directory = self.root / "topics" / name
        try:
            topic = Topic(name, directory, settings, self.files)
        except (OSError, StorageError) as exc:
            _remove_tree(directory)
            if isinstance(exc, StorageError):
                raise
            raise storage_error(exc, f"creating topic {name!r}") from exc
        try:
            write_atomic(directory / "topic.json", msgspec.json.encode(settings))
        except OSError as exc:
            for plog in topic.partitions:
                plog.delete()
            _remove_tree(directory)
            raise storage_error(exc, f"creating topic {name!r}") from exc
        self.topics[name] = topic
        return topic

    def _check_partition_budget(self, adding: int) -> None:
        total = sum(len(t.partitions) for t in self.topics.values())
        if total + adding > self.config.max_partitions:
            raise LimitReached(
                f"partition limit reached: {total} of {self.config.max_partitions} in use, {adding} asked"
            )

    def topic(self, name: str) -> Topic:
        found = self.topics.get(check_name("topic", name))
        if found is None:
            raise NotFound(f"topic {name!r} not found")
        return found

    def add_partitions(self, name: str, count: int) -> Topic:
        topic = self.topic(name)
        if count > 10_000:
            raise BadRequest("num_partitions must be <= 10000")
        self._check_partition_budget(count - len(topic.partitions))
        try:
            topic.grow(count)
            write_atomic(topic.directory / "topic.json", msgspec.json.encode(topic.settings))
        except OSError as exc:
            raise storage_error(exc, f"adding partitions to {name!r}") from exc
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
        self.idempotency.forget_topic(name)
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
        key = None
        if idempotency_key is not None:
            if not 1 <= len(idempotency_key) <= 256:
                raise BadRequest("idempotency_key must be 1..256 characters")
            key = f"{name}/{topic.settings.incarnation}/{idempotency_key}"
            seen = self.idempotency.get(key)
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
        marks = {p: topic.partitions[p].mark() for p in by_partition}
        try:
            for p, batch in by_partition.items():
                firsts[p] = topic.partitions[p].append(batch, timestamp)
            result = [(p, firsts[p] + i) for p, i in places]
            if key is not None:  # before any await: a concurrent retry must see it
                self.idempotency.put(key, result)
        except (OSError, StorageError) as exc:
            # All or nothing: what the other partitions took is taken back (nobody has read it).
            for p in firsts:
                topic.partitions[p].undo(marks[p])
            if isinstance(exc, StorageError):
                raise
            raise storage_error(exc, f"publish to {name!r}") from exc
        for p, batch in by_partition.items():
            topic.published[p] += len(batch)
            topic.notifiers[p].notify()
        self._count_publish(len(events), total)
        synced: list[Syncable] = [topic.partitions[p] for p in by_partition]
        if key is not None:
            synced.append(self.idempotency)
        await self.durability.written(*synced, records=len(events))
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
        try:
            self._save_group(group)
        except OSError as exc:
            raise storage_error(exc, f"creating consumer group {group_id!r}") from exc
        self.groups[group_id] = group
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
        self._commits(group_id).remove()
        del self._commit_files[group_id]
        (self.root / "groups" / f"{group_id}.json").unlink(missing_ok=True)
        return True

    def group_changed(self, group: GroupCoordinator) -> None:
        self.counters["rebalances"] += 1
        try:
            self._save_group(group)
        except OSError as exc:
            # Membership is soft state (members rejoin after a restart); the commits are safe in
            # the snapshot and commit file as they were.
            raise storage_error(exc, f"saving consumer group {group.group_id!r}") from exc
        finally:
            self.group_notifier.notify()

    async def commit(
        self, group_id: str, partition: int, offset: int, member_id: str | None, generation: int | None
    ) -> None:
        """Commit an offset: acknowledged once written (and, with ``fsync=always``, synced)."""
        group = self.group(group_id)
        before = group.generation
        previous = group.committed.get(partition)
        try:
            group.commit(partition, offset, time.monotonic(), member_id, generation)
        except GroupError:
            self.counters["commits_rejected"] += 1
            if group.generation != before:
                self.group_changed(group)
            raise
        commits = self._commits(group_id)
        try:
            commits.append(msgspec.msgpack.encode((partition, offset)))
        except OSError as exc:
            if previous is None:
                group.committed.pop(partition, None)
            else:
                group.committed[partition] = previous
            raise storage_error(exc, f"commit of {group_id!r} partition {partition}") from exc
        self.counters["commits"] += 1
        if commits.records >= 10_000:
            try:
                self._save_group(group)  # compact: the snapshot holds every commit
            except OSError as exc:
                log.warning("compacting the commits of %s failed (%s); kept as they are", group_id, exc)
        await self.durability.written(commits)

    def _commits(self, group_id: str) -> RecordFile:
        commits = self._commit_files.get(group_id)
        if commits is None:
            commits = RecordFile(self.root / "groups" / f"{group_id}.offsets")
            self._commit_files[group_id] = commits
        return commits

    def _save_group(self, group: GroupCoordinator) -> None:
        """The group's snapshot, written atomically; then the commits it holds are dropped."""
        path = self.root / "groups" / f"{group.group_id}.json"
        write_atomic(path, json.dumps(group.snapshot()).encode(), sync=self.config.fsync != "never")
        self._commits(group.group_id).remove()

    def _replay_commits(self, group: GroupCoordinator) -> None:
        for payload in self._commits(group.group_id).load():
            try:
                partition, offset = msgspec.msgpack.decode(payload)
                group.committed[int(partition)] = int(offset)
            except (msgspec.DecodeError, ValueError, TypeError):
                self._report(f"consumer group {group.group_id}: an unreadable commit record skipped")

    # --- helpers -------------------------------------------------------------------------------------

    def _encode_checked(self, event: StoredEvent) -> bytes:
        try:
            payload = encode_event(event)
        except (OverflowError, msgspec.EncodeError) as exc:
            raise BadRequest(f"event cannot be stored: {exc} (integers must fit in 64 bits)") from None
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
    """The answers to recent idempotent publishes, kept in a file across restarts.

    Bounded three ways: at most ``capacity`` keys, about ``max_bytes`` of memory, and ``ttl`` seconds
    each; the oldest go first. A publish repeated within those bounds appends nothing; one repeated
    later appends again. Keys carry the topic's incarnation, so a topic deleted and made again
    starts with none.
    """

    ENTRY_OVERHEAD = 200  # bytes of a dict entry, its tuple and list, roughly

    def __init__(self, capacity: int = 100_000, max_bytes: int = 64 << 20, ttl: float = 7 * 86400.0) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.entries: OrderedDict[str, tuple[float, list[tuple[int, int]]]] = OrderedDict()
        self.bytes = 0
        self._file: RecordFile | None = None
        self._sync = True
        self.closed = False

    def open(self, path: Path, *, sync: bool = True) -> None:
        self._file, self._sync = RecordFile(path), sync
        now = time.time()
        for payload in self._file.load():
            try:
                key, places, at = msgspec.msgpack.decode(payload)
                self._remember(key, [(int(p), int(o)) for p, o in places], float(at))
            except (msgspec.DecodeError, ValueError, TypeError):
                continue  # an entry of an older format, or garbage: forgotten (the bound allows it)
        self.expire(now)
        try:
            self._rewrite()
        except OSError as exc:  # a full disk: appended to as it is, compacted later
            log.warning("%s: not compacted (%s)", path, exc)

    def get(self, key: str) -> list[tuple[int, int]] | None:
        found = self.entries.get(key)
        if found is None or found[0] < time.time() - self.ttl:
            return None
        return found[1]

    def put(self, key: str, places: list[tuple[int, int]]) -> None:
        """Remember an answer; written to the file first (an OSError leaves nothing remembered)."""
        at = time.time()
        if self._file is not None:
            self._file.append(msgspec.msgpack.encode((key, places, at)))
        self._remember(key, places, at)
        if self._file is not None and self._file.records > 2 * self.capacity:
            with contextlib.suppress(OSError):  # compaction can wait for a later put
                self._rewrite()

    def forget_topic(self, topic: str) -> None:
        prefix = topic + "/"
        for key in [k for k in self.entries if k.startswith(prefix)]:
            self._drop(key)

    def expire(self, now: float) -> None:
        while self.entries:
            key, (at, _) = next(iter(self.entries.items()))
            if at >= now - self.ttl:
                break
            self._drop(key)

    def _cost(self, key: str, places: list[tuple[int, int]]) -> int:
        return self.ENTRY_OVERHEAD + len(key) + 72 * len(places)

    def _remember(self, key: str, places: list[tuple[int, int]], at: float) -> None:
        if key in self.entries:
            self._drop(key)
        self.entries[key] = (at, places)
        self.bytes += self._cost(key, places)
        while len(self.entries) > self.capacity or (self.bytes > self.max_bytes and len(self.entries) > 1):
            self._drop(next(iter(self.entries)))

    def _drop(self, key: str) -> None:
        _, places = self.entries.pop(key)
        self.bytes -= self._cost(key, places)

    def _rewrite(self) -> None:
        """Compact the file to the entries kept."""
        if self._file is not None:
            payloads = [msgspec.msgpack.encode((k, p, at)) for k, (at, p) in self.entries.items()]
            self._file.rewrite(payloads, sync=self._sync)

    def sync_fd(self) -> int:
        assert self._file is not None
        return self._file.sync_fd()

    def __repr__(self) -> str:
        return f"idempotency answers {self._file}"

    def close(self) -> None:
        self.closed = True
        if self._file is not None:
            self._file.close()


def _remove_tree(directory: Path) -> None:
    """Remove what a failed create left (best effort: the disk may be failing)."""
    for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() else path.unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()


__all__ = ["StreamEngine", "StreamError", "StreamsConfig"]
