"""The streams service with rooms, topics and consumer groups on JetStream, and pub/sub across its
servers over core NATS.

Topic settings live in a key-value bucket that every server watches, so a topic made through one
server is served by all. Each server keeps, per partition, the bounds JetStream last reported
(from its own acknowledgements, from the notice each server sends after an append, and from a
periodic stream-info): views and lag read those; reads go to JetStream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from meshplane.core.groups import GroupCoordinator, GroupError
from meshplane.core.mesh.vpn import DEFAULT
from meshplane.core.streamlog import RetentionPolicy, StoredEvent, encode_record
from meshplane.streams.config import StreamsConfig, check_name, now_ms
from meshplane.streams.errors import BadRequest, Conflict, NotFound, OffsetOutOfRange
from meshplane.streams.events import StreamEvent, decode_stream_event
from meshplane.streams.groups import describe_group
from meshplane.streams.jetstream import naming
from meshplane.streams.jetstream.groups import SharedGroups
from meshplane.streams.jetstream.pubsub import ClusterPubSub
from meshplane.streams.jetstream.rooms import SharedRoom, SharedRooms
from meshplane.streams.jetstream.store import JetStreamStore, StreamBounds, Unavailable
from meshplane.streams.jetstream.topics import JetStreamTopic
from meshplane.streams.rooms import Room
from meshplane.streams.service import StreamsService
from meshplane.streams.staging import Placed, append_by_partition
from meshplane.streams.topics import RawSpan, TopicBase, TopicSettings, check_new_topic

log = logging.getLogger(__name__)


class JetStreamStreamsService(StreamsService):
    def __init__(
        self,
        config: StreamsConfig | None,
        servers: list[str],
        *,
        replicas: int = 1,
        start_timeout: float = 60.0,
        progress: Callable[[str], None] | None = None,
        vpn: str = DEFAULT,
    ) -> None:
        super().__init__(config)
        if replicas not in (1, 3, 5):
            raise BadRequest(f"replicas must be 1, 3 or 5 (a Raft group of that many), not {replicas}")
        self.store = JetStreamStore(
            servers,
            replicas=replicas,
            start_timeout=start_timeout,
            progress=progress or log.warning,
            names=naming.Naming(vpn),
        )
        self.local_files = False
        self.shared_topics: dict[str, JetStreamTopic] = {}
        self.shared_groups: SharedGroups | None = None
        self.shared_rooms = SharedRooms(self.store, self.rooms, self.counters, self._room_byte_limit)
        self._watchers: list[asyncio.Task[None]] = []
        self._shared_upkeep: asyncio.Task[None] | None = None
        self._background_tasks: set[asyncio.Task[Any]] = set()
        self.cluster_pubsub: ClusterPubSub | None = None

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.connect(self._on_notice)
        self.shared_groups = SharedGroups(self.store.groups_kv, self.counters)
        await self.store.follow_rooms(self.shared_rooms.on_event)
        assert self.store.nc is not None
        self.cluster_pubsub = ClusterPubSub(self.store.nc, self.pubsub, self.store.naming.pubsub_prefix)
        await self.cluster_pubsub.start()
        buckets = (
            (self.store.topics_kv, self._saw_topic),
            (self.store.groups_kv, self.shared_groups.seen),
            (self.store.rooms_kv, self.shared_rooms.seen),
        )
        for kv, apply in buckets:
            watcher = await kv.watchall()
            await self._initial(watcher, apply)
            self._watchers.append(asyncio.create_task(self._follow(watcher, apply)))
        await asyncio.gather(*(self._refresh(t) for t in list(self.shared_topics.values())))
        await self.shared_rooms.settle()
        await super().start()

    async def fresh_room(self, name: str) -> Room:
        """Read your writes through any server: the view is brought up to the room's stream."""
        room = await self.shared_rooms.caught_up(check_name("room", name))
        return self.room(name) if room is None else room

    def _load_rooms(self) -> None:
        """Rooms are JetStream's (followed from start()), not the data directory's."""

    async def _initial(self, watcher: Any, apply: Any) -> None:
        """Apply what the bucket holds now (the watcher's first ``None`` marks the end of it)."""
        while (entry := await watcher.updates(timeout=self.store.timeout)) is not None:
            apply(entry.key, entry.value if entry.operation is None else None)

    async def _follow(self, watcher: Any, apply: Any) -> None:
        async for entry in watcher:
            try:
                apply(entry.key, entry.value if entry.operation is None else None)
            except Exception:
                log.exception("applying a change of %s failed", entry.key)

    def _saw_topic(self, key: str, value: bytes | None) -> None:
        name = naming.unescape(key)
        if value is None:
            self.shared_topics.pop(name, None)
            return
        try:
            settings = msgspec.json.decode(value, type=TopicSettings)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._report(f"topic {name}: unreadable settings in JetStream ({exc})")
            return
        known = self.shared_topics.get(name)
        if known is None or known.settings.incarnation != settings.incarnation:
            self.shared_topics[name] = JetStreamTopic(name, settings)
        else:
            known.settings = settings
            known.grow_to(settings.num_partitions)

    async def _refresh(self, topic: JetStreamTopic) -> None:
        for p, partition in enumerate(topic.partitions):
            with contextlib.suppress(Unavailable, nats.js.errors.NotFoundError):
                partition.saw(await self.store.bounds(topic.name, p))

    async def _on_notice(self, msg: Msg) -> None:
        place = self.store.naming.parse_notice(msg.subject)
        seq = msg.data
        if place is None or not seq.isdigit() or len(seq) > 20:  # a JetStream sequence is a uint64
            return
        topic = self.shared_topics.get(place[0])
        if topic is not None and place[1] < len(topic.partitions):
            topic.partitions[place[1]].saw_sequence(int(seq))
            topic.notifiers[place[1]].notify()

    async def close(self) -> None:
        tasks = [
            *self._watchers,
            *self._background_tasks,
            *([self._shared_upkeep] if self._shared_upkeep else []),
        ]
        for task in tasks:
            task.cancel()
        self.shared_rooms.close()
        if self.cluster_pubsub is not None:
            await self.cluster_pubsub.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().close()
        await self.store.close()

    def limits(self) -> dict[str, tuple[int, int]]:
        found = super().limits()
        found["topics"] = (len(self.shared_topics), self.config.max_topics)
        found["partitions"] = (self._partition_count, self.config.max_partitions)
        return found

    @property
    def _partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.shared_topics.values())

    def maintain(self, monotonic_now: float) -> None:
        super().maintain(monotonic_now)  # rooms' views, pub/sub (JetStream applies the streams' limits)
        if self._shared_upkeep is None or self._shared_upkeep.done():  # one pass at a time
            self._shared_upkeep = asyncio.get_running_loop().create_task(self._upkeep())

    async def _upkeep(self) -> None:
        """The bounds of every partition (what other servers and JetStream's retention changed), and
        the sessions that timed out."""
        try:
            for topic in list(self.shared_topics.values()):
                await self._refresh(topic)
            await self.shared_rooms.refresh()
            await self._expire_groups()
        except Exception:
            log.exception("JetStream upkeep failed")

    async def _expire_groups(self) -> None:
        groups = self._groups()
        now = time.time()
        for group_id, group in list(groups.groups.items()):
            if any(now > m.deadline for m in group.members.values()):
                with contextlib.suppress(NotFound, Unavailable):
                    await groups.change(group_id, lambda g, t: g.expire(t))

    # --- rooms ---------------------------------------------------------------------------------------

    async def _make_room(
        self, name: str, max_events: int, retention_secs: float | None, exist_ok: bool
    ) -> tuple[Room, bool]:
        return await self.shared_rooms.create(name, max_events, retention_secs, exist_ok)

    async def delete_room(self, name: str) -> bool:
        return await self.shared_rooms.delete(check_name("room", name))

    def _remove_room(self, room: Room) -> None:
        """An idle room (no event for the inactivity timeout, no subscriber here) is deleted for all."""
        name = f"delete-room:{room.name}"
        if any(task.get_name() == name for task in self._background_tasks):
            return  # being deleted (seen idle again by the next upkeep)
        task = asyncio.get_running_loop().create_task(self.delete_room(room.name), name=name)
        self._background_tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("deleting an idle room failed: %r", task.exception())

    async def _append_to_room(self, room: Room, body: StoredEvent, payload: bytes) -> StreamEvent:
        assert isinstance(room, SharedRoom)
        return await self.shared_rooms.publish(room, body, payload)

    # --- topics --------------------------------------------------------------------------------------

    @property
    def topics(self) -> Mapping[str, TopicBase[Any]]:
        return self.shared_topics

    def topic(self, name: str) -> JetStreamTopic:
        found = self.shared_topics.get(check_name("topic", name))
        if found is None:
            raise NotFound(f"topic {name!r} not found")
        return found

    async def create_topic(
        self,
        name: str,
        num_partitions: int | None = None,
        replication_factor: int = 1,
        retention: RetentionPolicy | None = None,
        segment_bytes: int | None = None,
    ) -> JetStreamTopic:
        check_name("topic", name)
        if len(self.store.naming.partition_stream(name, 10_000)) > naming.MAX_STREAM_NAME:
            raise BadRequest(f"topic name {name!r} is too long for a JetStream stream name")
        partitions = check_new_topic(
            self.config, (len(self.shared_topics), self._partition_count), num_partitions
        )
        if replication_factor not in (1, self.store.replicas):
            raise BadRequest(
                f"replication_factor must be the server's --replicas ({self.store.replicas}), "
                f"not {replication_factor}"
            )
        settings = TopicSettings(
            partitions,
            self.store.replicas,
            retention or RetentionPolicy(),
            segment_bytes or self.config.segment_bytes,
            time.time(),
            incarnation=uuid.uuid4().hex,
        )
        topic = JetStreamTopic(name, settings)
        # The streams first: a topic whose settings are seen has its streams (a crash in between
        # leaves streams nobody lists, which the next create of that name takes over).
        for p in range(partitions):
            topic.partitions[p].saw(await self._ensure(name, p, settings))
        try:
            await self.store.topics_kv.create(naming.escape(name), msgspec.json.encode(settings))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise Conflict(f"topic {name!r} already exists") from None
        except nats.errors.TimeoutError:
            raise Unavailable(f"JetStream did not store topic {name!r}") from None
        self.shared_topics[name] = topic
        return topic

    async def _ensure(self, name: str, partition: int, settings: TopicSettings) -> StreamBounds:
        window = max(1.0, min(self.config.idempotency_ttl_secs, 24 * 3600.0))
        return await self.store.ensure_partition(
            name, partition, naming.retention_limits(settings.retention), window
        )

    async def set_topic_retention(self, name: str, retention: RetentionPolicy) -> JetStreamTopic:
        """Each partition's stream takes the new limits (JetStream applies them), then the settings."""
        topic = self.topic(name)
        settings = msgspec.structs.replace(topic.settings, retention=retention)
        for p in range(len(topic.partitions)):
            await self._ensure(name, p, settings)
        entry = await self.store.topics_kv.get(naming.escape(name))
        await self.store.topics_kv.update(
            naming.escape(name), msgspec.json.encode(settings), last=entry.revision
        )
        topic.settings = settings
        return topic

    async def add_partitions(self, name: str, count: int) -> JetStreamTopic:
        topic = self.topic(name)
        if count <= len(topic.partitions):
            raise BadRequest(
                f"topic {name!r} has {len(topic.partitions)} partitions: ask for more, not {count}"
            )
        if count > 10_000:
            raise BadRequest("num_partitions must be <= 10000")
        settings = msgspec.structs.replace(topic.settings, num_partitions=count)
        for p in range(len(topic.partitions), count):
            await self._ensure(name, p, settings)
        entry = await self.store.topics_kv.get(naming.escape(name))
        await self.store.topics_kv.update(
            naming.escape(name), msgspec.json.encode(settings), last=entry.revision
        )
        topic.settings = settings
        topic.grow_to(count)
        for group_id, group in list(self._groups().groups.items()):
            if group.topic == name:
                await self._groups().change(group_id, lambda g, t: g.resize(count, t))
        return topic

    async def delete_topic(self, name: str) -> bool:
        topic = self.shared_topics.get(check_name("topic", name))
        if topic is None:
            return False
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.store.topics_kv.delete(naming.escape(name))
        for p in range(len(topic.partitions)):
            await self.store.delete_partition(name, p)
        self.shared_topics.pop(name, None)
        return True

    async def read_topic(
        self, name: str, partition: int, from_offset: int, limit: int, *, counted: bool = True
    ) -> list[StreamEvent]:
        records = await self._records(name, partition, from_offset, limit, 8 << 20)
        events = [decode_stream_event(r, partition) for r in records]
        if counted:
            self.shared_topics[name].consumed[partition] += len(events)
            self.counters["events_consumed"] += len(events)
        return events

    async def read_topic_raw(self, name: str, partition: int, from_offset: int, max_bytes: int) -> bytes:
        records = await self._records(name, partition, from_offset, 100_000, max_bytes)
        return b"".join(encode_record(r.offset, r.timestamp_ms, r.payload) for r in records)

    async def _records(
        self, name: str, partition: int, from_offset: int, limit: int, max_bytes: int
    ) -> list[Any]:
        await self._check_readable(name, partition, from_offset)
        plog = self.topic(name).log_of(partition)
        records = await self.store.read(name, partition, from_offset, limit, max_bytes)
        if records and records[0].offset != from_offset:  # retention removed it meanwhile
            raise OffsetOutOfRange(from_offset, records[0].offset, plog.next_offset - 1)
        if records:
            plog.saw_sequence(records[-1].offset + 1)
        return records

    async def _check_readable(self, name: str, partition: int, from_offset: int) -> None:
        """The view may be behind JetStream (a notice lost, or heard before the topic was): an offset
        outside it is checked against what JetStream holds before it is refused."""
        topic = self.topic(name)
        plog = topic.log_of(partition)
        if from_offset < plog.start_offset or from_offset > plog.next_offset:
            plog.saw(await self.store.bounds(name, partition))
        topic.check_offset(partition, from_offset)

    def local_span(self, name: str, partition: int, from_offset: int, max_bytes: int) -> RawSpan | None:
        return None

    async def offsets_for_time(self, name: str, timestamp_ms: int) -> list[int]:
        topic = self.topic(name)
        found = []
        for p, plog in enumerate(topic.partitions):
            offset = await self.store.first_at_or_after(name, p, timestamp_ms)
            found.append(plog.next_offset if offset is None else offset)
        return found

    async def publish_topic(
        self,
        name: str,
        events: list[StoredEvent],
        partition: int | None = None,
        idempotency_key: str | None = None,
    ) -> list[tuple[int, int]]:
        """As the local service; a retry with the same ``idempotency_key`` within the streams'
        duplicate window appends nothing (JetStream's message-id deduplication) and answers the first
        offsets. Unlike the local log, a batch spread over partitions is not all-or-nothing: a
        failure part-way is completed by the retry."""
        topic = self.topic(name)
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= 256:
            raise BadRequest("idempotency_key must be 1..256 characters")
        encoded = [self.encode(e) for e in events]
        by_partition: dict[int, list[int]] = {}
        for i, event in enumerate(events):
            if event.key is None and partition is None and idempotency_key is not None:
                # A retry through another server must land where the first try did.
                chosen = zlib.crc32(f"{idempotency_key}#{i}".encode()) % len(topic.partitions)
            else:
                chosen = topic.choose_partition(event.key, partition)
            by_partition.setdefault(chosen, []).append(i)
        timestamp = now_ms()
        result: list[tuple[int, int]] = [(0, 0)] * len(events)
        duplicates = 0
        for p, indexes in by_partition.items():
            ids = None
            if idempotency_key is not None:
                ids = [
                    naming.message_id(f"{topic.settings.incarnation}/{idempotency_key}", i) for i in indexes
                ]
            offsets, repeated = await self.store.append(
                name, p, [encoded[i] for i in indexes], timestamp, ids
            )
            for i, offset in zip(indexes, offsets, strict=True):
                result[i] = (p, offset)
            duplicates += repeated
            topic.partitions[p].saw_sequence(max(offsets) + 1)
            topic.published[p] += len(indexes)
            topic.notifiers[p].notify()
        self._count_publish(len(events) - duplicates, sum(map(len, encoded)))
        self.counters["duplicates_skipped"] += duplicates
        return result

    async def _append_staged(self, name: str, placed: list[Placed], key: str) -> None:
        await append_by_partition(self.publish_topic, name, placed, key)

    # --- consumer groups -----------------------------------------------------------------------------

    def _groups(self) -> SharedGroups:
        assert self.shared_groups is not None, "start() the service first"
        return self.shared_groups

    @property
    def groups(self) -> dict[str, GroupCoordinator]:
        return self._groups().groups

    def group(self, group_id: str) -> GroupCoordinator:
        found = self._groups().groups.get(check_name("group", group_id))
        if found is None:
            raise NotFound(f"consumer group {group_id!r} not found")
        return found

    async def fresh_group(self, group_id: str) -> GroupCoordinator:
        return (await self._groups().load(group_id))[0]

    async def _store_new_group(
        self, group_id: str, topic: str, partitions: int, strategy: str, session_timeout: float
    ) -> GroupCoordinator:
        return await self._groups().create(group_id, topic, partitions, strategy, session_timeout)

    async def delete_group(self, group_id: str) -> bool:
        return await self._groups().delete(group_id)

    async def join_group(
        self, group_id: str, member: str, session_timeout: float | None
    ) -> tuple[int, list[int]]:
        result = await self._groups().change(group_id, lambda g, t: g.join(member, t, session_timeout))
        return result.generation, result.assignment.get(member, [])

    async def group_assignment(self, group_id: str, member: str) -> tuple[int, list[int]]:
        return await self._groups().change(group_id, lambda g, t: (g.generation, g.assignment_of(member, t)))

    async def group_heartbeat(self, group_id: str, member: str) -> tuple[int, list[int]]:
        return await self._groups().change(
            group_id, lambda g, t: (g.heartbeat(member, t), list(g.assignment.get(member, [])))
        )

    async def leave_group(self, group_id: str, member: str) -> int:
        return await self._groups().change(group_id, lambda g, t: g.leave(member, t).generation)

    async def commit(
        self, group_id: str, partition: int, offset: int, member_id: str | None, generation: int | None
    ) -> None:
        """Acknowledged once the group's new state is stored on a quorum of the bucket's replicas."""
        try:
            await self._groups().change(
                group_id, lambda g, t: g.commit(partition, offset, t, member_id, generation)
            )
        except GroupError:
            self.counters["commits_rejected"] += 1
            raise
        self.counters["commits"] += 1

    async def group_stats(self, group_id: str) -> dict[str, Any]:
        group = await self._groups().change(group_id, lambda g, t: (g.expire(t), g)[1])
        stats = describe_group(group, time.time())
        stats["lag"] = {str(p): lag for g, p, lag in self.lag() if g == group_id}
        return stats
