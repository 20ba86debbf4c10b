"""The streams service: rooms, partitioned topics, consumer groups and pub/sub over one data directory.

Layout of ``data_dir``::

    rooms/<room>/room.json              settings
    rooms/<room>/<base>.log|.index      the room's log
    topics/<topic>/topic.json           partitions, retention, segment size, incarnation
    topics/<topic>/<partition>/...      one log per partition
    groups/<group>.json                 group snapshot (members, generation, assignment, offsets)
    groups/<group>.offsets              commits since the snapshot (records, replayed on start)
    idempotency.log                     answers to recent idempotent publishes
    staging/<stage>.stage               staged writes waiting for their commit (Spark's sink)

Everything runs on one asyncio loop; only fsync goes to a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from meshplane.core.groups import GroupCoordinator
from meshplane.core.streamlog import RetentionPolicy, StoredEvent
from meshplane.streams.config import StreamsConfig, check_name, new_event_id, now_ms
from meshplane.streams.durability import Durability, Syncable
from meshplane.streams.errors import BadRequest, Conflict, LimitReached, NotFound, storage_error
from meshplane.streams.events import StreamEvent, encode_checked
from meshplane.streams.files import FilePool, write_atomic
from meshplane.streams.groups import GroupStore, check_new_group, group_partitions
from meshplane.streams.idempotency import IdempotencyTable, routed
from meshplane.streams.limit_calls import LimitCalls
from meshplane.streams.pubsub import PubSub, PubSubLimits
from meshplane.streams.recovery_report import DataProblems, counted_not_logged, local_logs, summarise
from meshplane.streams.rooms import LocalRoom, Room, read_room_settings, room_settings
from meshplane.streams.staging import StagedWrites, StagingStore
from meshplane.streams.topics import RawSpan, TopicBase, TopicStore, group_lag

log = logging.getLogger(__name__)


class StreamsService(StagedWrites, LimitCalls):
    """Rooms, partitioned topics, consumer groups and pub/sub over one data directory.

    Every state change goes through here (persisted, counted, waiters woken) and raises the streams
    error family; the HTTP, WebSocket, SSE and command adapters only translate.
    """

    def __init__(self, config: StreamsConfig | None = None) -> None:
        self.config = config or StreamsConfig()
        self.root = Path(self.config.data_dir)
        self.rooms: dict[str, Room] = {}
        self.files = FilePool(self.config.max_open_files)
        self.problems = DataProblems(self.root)  # what was found wrong in the data directory
        self._report, self._set_aside = self.problems.report, self.problems.set_aside
        queue, policy = self.config.pubsub_queue_size, self.config.pubsub_backpressure
        self.pubsub = PubSub(PubSubLimits(queue_messages=queue, backpressure_policy=policy))
        self.durability = Durability(
            self.config.fsync, self.config.fsync_interval_ms, self.config.fsync_every_records
        )
        self.idempotency = answers = IdempotencyTable(
            self.config.idempotency_keys, self.config.idempotency_bytes, self.config.idempotency_ttl_secs
        )
        self.staging = StagingStore.of(self.root, self.config)
        self._cleanup: asyncio.Task[None] | None = None
        self.counters: dict[str, int] = {
            "events_published": 0,
            "bytes_published": 0,
            "events_consumed": 0,
            "bytes_read_in_bulk": 0,  # raw records served or located for bulk readers (Spark)
            "commits": 0,
            "commits_rejected": 0,
            "duplicates_skipped": 0,
            "rebalances": 0,
            "room_events_unreadable": 0,
        }
        self.topic_store = TopicStore(
            self.root / "topics", self.files, self.config, self._report, self._set_aside, answers.sync
        )
        self.group_store = GroupStore(
            self.root / "groups", self.counters, sync=self.config.fsync != "never", report=self._report
        )
        self.ready = False
        self.local_files = True  # topics' logs are files on this host (sendfile, short-circuit reads)

    # --- lifecycle -----------------------------------------------------------------------------------

    def open(self) -> None:
        """Load everything under the data directory (recovering torn logs). A metadata file that
        cannot be read is set aside (``<name>.corrupt-<time>``) and reported; the server starts."""
        try:
            with counted_not_logged():
                self._open()
        except OSError as exc:
            raise storage_error(exc, f"opening the data directory {self.root}") from exc
        summary = summarise(self.root, self._logs())
        if summary is not None:
            log.error("%s", summary)

    def _open(self) -> None:
        for sub in ("rooms", "topics", "groups"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._load_rooms()
        for directory in sorted(p for p in (self.root / "topics").iterdir() if p.is_dir()):
            self.topic_store.load(directory)
        sync = self.config.fsync != "never"
        self.idempotency.open(self.root / "idempotency.log", sync=sync, topics=self.topic_store.topics)
        self.staging.open(time.time())
        self.group_store.load(self._set_aside)
        self.ready = True

    def _load_rooms(self) -> None:
        for directory in sorted(p for p in (self.root / "rooms").iterdir() if p.is_dir()):
            self._load_room(directory)

    def _load_room(self, directory: Path) -> None:
        defaults = (self.config.room_max_events, self.config.room_retention_secs, time.time())
        settings = read_room_settings(directory, defaults, self._report, self._set_aside)
        if settings is None:
            return  # a room deleted while the server stopped halfway
        room = self._new_room(directory.name, *settings)
        if not (directory / "room.json").exists():
            write_atomic(directory / "room.json", json.dumps(room.settings()).encode())

    def limits(self) -> dict[str, tuple[int, int]]:
        """Each bounded resource: (in use, limit)."""
        c = self.config
        return {
            "topics": (self.topic_store.topic_count, c.max_topics),
            "partitions": (self.topic_store.partition_count, c.max_partitions),
            "rooms": (len(self.rooms), c.max_rooms),
            "groups": (len(self.groups), c.max_groups),
            "room_memory_bytes": (sum(r.ring_bytes for r in self.rooms.values()), c.room_memory_bytes),
            "open_files": (len(self.files), self.files.capacity),
            "idempotency_keys": (len(self.idempotency.entries), c.idempotency_keys),
            "idempotency_bytes": (self.idempotency.bytes, c.idempotency_bytes),
            **self.staging.use(),
            "pubsub_registrations": (len(self.pubsub.registered), self.pubsub.limits.registered_subscribers),
            "pubsub_listeners": (len(self.pubsub.listeners), self.pubsub.limits.listeners),
        }

    def storage_problems(self) -> list[str]:
        """What recovery found and set aside, in metadata and in every log."""
        return [*self.problems.found, *(f"{n}: {p}" for n, _, problems in self._logs() for p in problems)]

    def _logs(self) -> list[tuple[str, int, list[str]]]:
        return local_logs(self.rooms.values(), self.topic_store.topics.values())

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
            room.close()
        for topic in self.topic_store.topics.values():  # the local logs (JetStream keeps its own)
            for plog in topic.partitions:
                plog.sync()
                plog.close()
        self.idempotency.close()
        self.group_store.close()
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
            room.expire(wall_ms)
            idle = room.idle_for(time.time())
            if idle > self.config.room_inactive_timeout:
                log.info("room %s inactive since %.0f s: removed", room.name, idle)
                self._remove_room(room)
        budget = self.config.verify_bytes_per_cycle
        for topic in self.topic_store.topics.values():  # the local logs (JetStream keeps its own)
            for plog in topic.partitions:
                plog.apply_retention(wall_ms)
                if budget > 0:
                    budget -= plog.verify_step(budget)
        self.idempotency.expire(time.time())
        self.staging.expire(time.time())
        self.pubsub.expire(monotonic_now)
        self.group_store.expire()

    # --- rooms ---------------------------------------------------------------------------------------

    async def create_room(
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
            raise LimitReached(f"room limit reached ({self.config.max_rooms} rooms)", "rooms")
        return await self._make_room(name, *room_settings(self.config, max_events, retention_secs), exist_ok)

    async def _make_room(
        self, name: str, max_events: int, retention_secs: float | None, exist_ok: bool
    ) -> tuple[Room, bool]:
        """Store a new room (its settings checked); (the room, whether it was made now)."""
        room = self._new_room(name, max_events, retention_secs, time.time())
        try:
            write_atomic(room.directory / "room.json", json.dumps(room.settings()).encode())
        except OSError as exc:
            self.rooms.pop(name, None)
            room.log.delete()
            raise storage_error(exc, f"creating room {name!r}") from exc
        return room, True

    def _new_room(
        self, name: str, max_events: int, retention_secs: float | None, created: float
    ) -> LocalRoom:
        room = LocalRoom(
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

    def room(self, name: str) -> Room:
        found = self.rooms.get(check_name("room", name))
        if found is None:
            raise NotFound(f"room {name!r} not found")
        return found

    async def fresh_room(self, name: str) -> Room:
        """The room as it is now (on a shared backend, with every event stored through any server)."""
        return self.room(name)

    async def room_or_create(self, name: str) -> Room:
        """The room, made with the defaults when it is missing and rooms are made on first use."""
        found = self.rooms.get(check_name("room", name))
        if found is not None:
            return found
        if self.config.auto_create_rooms:
            return (await self.create_room(name, exist_ok=True))[0]
        raise NotFound(f"room {name!r} not found")

    async def delete_room(self, name: str) -> bool:
        room = self.rooms.get(check_name("room", name))
        if room is None:
            return False
        self._remove_room(room)
        return True

    def _remove_room(self, room: Room) -> None:
        assert isinstance(room, LocalRoom)
        self.rooms.pop(room.name, None)
        room.log.delete()
        (room.directory / "room.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            room.directory.rmdir()
        room.ended()

    async def publish_room(
        self,
        name: str,
        event_type: str,
        data: Any,
        metadata: dict[str, str] | None = None,
    ) -> tuple[Room, StreamEvent]:
        body = StoredEvent(new_event_id(), event_type, data, None, metadata)
        payload = self.encode(body)  # before the room is made: a refused event makes none
        room = await self.room_or_create(name)
        event = await self._append_to_room(room, body, payload)
        self._count_publish(1, len(payload))
        return room, event

    async def _append_to_room(self, room: Room, body: StoredEvent, payload: bytes) -> StreamEvent:
        """Store one event; the event as read back, once it is acknowledged and pushed."""
        assert isinstance(room, LocalRoom)
        timestamp = now_ms()
        first = room.append([body], [payload], timestamp)
        await self.durability.written(room.log)
        event = room.read(first, 1)[0] if first >= room.oldest else StreamEvent(first, timestamp, body)
        room.broadcast(event)
        return event

    def read_room(
        self, name: str, from_offset: int | None, limit: int, to_offset: int | None = None
    ) -> tuple[Room, list[StreamEvent]]:
        room = self.room(name)
        start = room.resolve(from_offset)
        events = room.read(start, limit, to_offset)
        self.counters["events_consumed"] += len(events)
        return room, events

    # --- topics --------------------------------------------------------------------------------------

    @property
    def topics(self) -> Mapping[str, TopicBase[Any]]:
        return self.topic_store.topics

    async def create_topic(
        self,
        name: str,
        num_partitions: int | None = None,
        replication_factor: int = 1,
        retention: RetentionPolicy | None = None,
        segment_bytes: int | None = None,
    ) -> TopicBase[Any]:
        return self.topic_store.create(name, num_partitions, replication_factor, retention, segment_bytes)

    def topic(self, name: str) -> TopicBase[Any]:
        return self.topic_store.get(name)

    async def add_partitions(self, name: str, count: int) -> TopicBase[Any]:
        topic = self.topic_store.grow(name, count)
        self.group_store.resize(name, count)
        return topic

    async def delete_topic(self, name: str) -> bool:
        deleted = self.topic_store.delete(name)
        self.idempotency.forget_topic(name)
        return deleted

    async def read_topic(
        self, name: str, partition: int, from_offset: int, limit: int, *, counted: bool = True
    ) -> list[StreamEvent]:
        """Events from ``from_offset``; ``counted=False`` for looking (the dashboard), not consuming."""
        events = self.topic_store.get(name).read(partition, from_offset, limit, counted=counted)
        if counted:
            self.counters["events_consumed"] += len(events)
        return events

    async def read_topic_raw(self, name: str, partition: int, from_offset: int, max_bytes: int) -> bytes:
        """Records as :func:`meshplane.core.streamlog.scan_records` reads them (for bulk readers)."""
        return self.topic_store.get(name).read_raw(partition, from_offset, max_bytes)

    def local_span(self, name: str, partition: int, from_offset: int, max_bytes: int) -> RawSpan | None:
        """Where those records lie in a local segment file (to send them with ``sendfile``, or for a
        reader on this host to read them itself); ``None`` when there is nothing to send."""
        return self.topic_store.get(name).raw_span(partition, from_offset, max_bytes)

    async def offsets_for_time(self, name: str, timestamp_ms: int) -> list[int]:
        """Per partition, the first offset stamped at or after ``timestamp_ms`` (the end when none is)."""
        return self.topic_store.get(name).offsets_for_time(timestamp_ms)

    async def publish_topic(
        self,
        name: str,
        events: list[StoredEvent],
        partition: int | None = None,
        idempotency_key: str | None = None,
    ) -> list[tuple[int, int]]:
        """Append events (each routed by key, round-robin or ``partition``); returns (partition, offset)s.
        A request repeated with the same ``idempotency_key`` appends nothing and gets the first answer."""
        result, synced = self.append_topic(name, events, partition, idempotency_key)
        if synced:
            await self.durability.written(*synced, records=len(events))
        return result

    def append_topic(
        self,
        name: str,
        events: list[StoredEvent],
        partition: int | None = None,
        idempotency_key: str | None = None,
        placed: list[int | None] | None = None,
    ) -> tuple[list[tuple[int, int]], list[Syncable]]:
        """:meth:`publish_topic` up to the fsync: the places, and what the durability loop must sync
        before they are acknowledged (for callers that commit several writes as a group); ``placed``:
        each event's partition (None: by key), instead of ``partition`` for all."""
        topic = self.topic_store.get(name)
        key = None
        if idempotency_key is not None:
            if not 1 <= len(idempotency_key) <= 256:
                raise BadRequest("idempotency_key must be 1..256 characters")
            key = f"{name}/{topic.settings.incarnation}/{idempotency_key}"
            seen = self.idempotency.get(key)
            if seen is not None:
                self.counters["duplicates_skipped"] += len(events)
                return seen, []
        partitions, events = routed(topic, events, placed or [partition] * len(events), idempotency_key)
        encoded = [self.encode(e) for e in events]  # all checked before anything is appended

        def remember(result: list[tuple[int, int]]) -> None:
            if key is not None:  # before any await: a concurrent retry must see it
                self.idempotency.put(key, result)

        result, written = topic.append_all(partitions, encoded, now_ms(), remember)
        self._count_publish(len(events), sum(map(len, encoded)))
        synced: list[Syncable] = list(written)
        if key is not None:
            synced.append(self.idempotency)
        return result, synced

    # --- consumer groups -----------------------------------------------------------------------------

    async def create_group(
        self,
        group_id: str,
        topic: str,
        partition_count: int | None = None,
        strategy: str = "round_robin",
        session_timeout: float | None = None,
        counted: tuple[Collection[str], int] | None = None,
    ) -> GroupCoordinator:
        """``counted``: (names, limit) a new group counts in, if not this service's (a VPN's queue groups)."""
        names, most = counted if counted is not None else (self.groups, self.config.max_groups)
        check_new_group(names, group_id, most)
        found = self.topics.get(topic)
        partitions = group_partitions(topic, len(found.partitions) if found else None, partition_count)
        timeout = session_timeout or self.config.default_session_timeout
        return await self._store_new_group(group_id, topic, partitions, strategy, timeout)

    async def _store_new_group(
        self, group_id: str, topic: str, partitions: int, strategy: str, session_timeout: float
    ) -> GroupCoordinator:
        return self.group_store.create(group_id, topic, partitions, strategy, session_timeout)

    @property
    def groups(self) -> dict[str, GroupCoordinator]:
        return self.group_store.groups

    def group(self, group_id: str) -> GroupCoordinator:
        return self.group_store.get(group_id)

    async def fresh_group(self, group_id: str) -> GroupCoordinator:
        """The group as it is now (on a shared backend, as the other servers left it too)."""
        return self.group(group_id)

    async def delete_group(self, group_id: str) -> bool:
        return self.group_store.delete(group_id)

    async def join_group(
        self, group_id: str, member: str, session_timeout: float | None
    ) -> tuple[int, list[int]]:
        """(generation, the member's partitions) after the rebalance its joining caused."""
        return self.group_store.join(group_id, member, session_timeout)

    async def group_assignment(self, group_id: str, member: str) -> tuple[int, list[int]]:
        partitions = self.group_store.assignment(group_id, member)
        return self.group(group_id).generation, partitions

    async def group_heartbeat(self, group_id: str, member: str) -> tuple[int, list[int]]:
        generation = self.group_store.heartbeat(group_id, member)
        return generation, self.group(group_id).assignment.get(member, [])

    async def leave_group(self, group_id: str, member: str) -> int:
        return self.group_store.leave(group_id, member)

    async def commit(
        self, group_id: str, partition: int, offset: int, member_id: str | None, generation: int | None
    ) -> None:
        """Commit an offset: acknowledged once written (and, with ``fsync=always``, synced)."""
        commits = self.group_store.commit(group_id, partition, offset, member_id, generation)
        await self.durability.written(commits)

    async def group_stats(self, group_id: str) -> dict[str, Any]:
        stats = self.group_store.stats(group_id)
        stats["lag"] = {str(p): lag for g, p, lag in self.lag() if g == group_id}
        return stats

    def encode(self, event: StoredEvent) -> bytes:
        return encode_checked(event, self.config.max_payload_bytes)

    def _count_publish(self, events: int, size: int) -> None:
        self.counters.update(events_published=events, bytes_published=size)

    def lag(self) -> Iterable[tuple[str, int, int]]:
        """(group, partition, lag) for every group of an existing topic."""
        return group_lag(self.groups.values(), self.topics)


__all__ = ["StreamsConfig", "StreamsService"]
