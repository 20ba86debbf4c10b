"""The streams service in-process on real files: group commit, limits, room expiry, idempotency, groups."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from meshplane.core.streamlog import StoredEvent
from meshplane.streams.errors import LimitReached, NotFound, OffsetOutOfRange
from meshplane.streams.service import StreamsConfig, StreamsService
from tests.faults import FaultInjector, crash
from tests.helpers import eventually


def event(i: int, key: str | None = None) -> StoredEvent:
    return StoredEvent(f"id{i}", "e", {"i": i}, key)


async def test_fsync_always_acknowledges_after_a_shared_fsync(tmp_path: Path) -> None:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path, fsync="always"))
    await engine.start()
    try:
        await engine.create_topic("t", 1)
        places = await asyncio.gather(*(engine.publish_topic("t", [event(i)]) for i in range(200)))
        assert sorted(p[0][1] for p in places) == list(range(200))
        assert 1 <= engine.durability.fsyncs < 200  # concurrent publishers shared fsyncs (group commit)
    finally:
        await engine.close()


async def test_fsync_interval_syncs_after_the_first_write_or_once_enough_records_wait(tmp_path: Path) -> None:
    engine = StreamsService(
        StreamsConfig(
            data_dir=tmp_path, fsync="interval", fsync_interval_ms=3_600_000, fsync_every_records=10
        )
    )
    await engine.start()
    try:
        await engine.create_topic("t", 1)
        for i in range(9):
            await engine.publish_topic("t", [event(i)])
        await asyncio.sleep(0.05)
        assert engine.durability.fsyncs == 0  # an hour to go and 9 < 10 records
        await engine.publish_topic("t", [event(9)])
        await eventually(lambda: engine.durability.fsyncs == 1, what="the 10th record triggers the fsync")
    finally:
        await engine.close()


async def test_fsync_interval_counts_from_the_first_unsynced_write(tmp_path: Path) -> None:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path, fsync="interval", fsync_interval_ms=500))
    await engine.start()
    try:
        await engine.create_topic("t", 1)
        await engine.publish_topic("t", [event(0)])
        assert engine.durability.fsyncs == 0
        await eventually(lambda: engine.durability.fsyncs == 1, what="synced within the interval")
    finally:
        await engine.close()


async def test_room_and_subscriber_limits(tmp_path: Path) -> None:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path, max_rooms=2, max_subscribers_per_room=1))
    engine.open()
    await engine.create_room("a")
    await engine.create_room("b")
    with pytest.raises(LimitReached, match="2 rooms"):
        await engine.create_room("c")
    engine.room("a").touch_subscriber("s1", engine.config.max_subscribers_per_room)
    engine.room("a").touch_subscriber(
        "s1", engine.config.max_subscribers_per_room
    )  # the same subscriber again is fine
    with pytest.raises(LimitReached, match="subscribers"):
        engine.room("a").touch_subscriber("s2", engine.config.max_subscribers_per_room)
    await engine.close()


async def test_rooms_expire_by_time_and_inactive_rooms_go(tmp_path: Path) -> None:
    engine = StreamsService(
        StreamsConfig(data_dir=tmp_path, auto_create_rooms=False, room_inactive_timeout=3600)
    )
    engine.open()
    with pytest.raises(NotFound):
        await engine.publish_room("nope", "e", 1)  # auto-create is off
    room, _ = await engine.create_room("timed", retention_secs=10)
    for i in range(5):
        await engine.publish_room("timed", "e", i)
    room.trim(room.last_event_ms() + 10_001)  # ten seconds and a bit later
    assert len(room) == 0
    with pytest.raises(OffsetOutOfRange):
        engine.read_room("timed", 0, 10)
    engine.config.room_inactive_timeout = 0.0
    engine.maintain(0.0)
    assert "timed" not in engine.rooms
    await engine.close()


async def test_idempotent_publishes_survive_a_restart(tmp_path: Path) -> None:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path))
    engine.open()
    await engine.create_topic("t", 2)
    first = await engine.publish_topic("t", [event(1), event(2)], idempotency_key="k1")
    await engine.close()
    again = StreamsService(StreamsConfig(data_dir=tmp_path))
    again.open()
    assert await again.publish_topic("t", [event(1), event(2)], idempotency_key="k1") == first
    assert sum(p.next_offset for p in again.topics["t"].partitions) == 2
    assert again.counters["duplicates_skipped"] == 2
    await again.close()


async def test_an_eviction_seen_through_group_stats_is_saved_counted_and_notified(tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from meshplane.streams.http.app import create_app

    engine = StreamsService(StreamsConfig(data_dir=tmp_path, cleanup_interval=3600))  # no sweep meanwhile
    await engine.start()
    async with TestClient(TestServer(create_app(engine))) as http:
        await engine.create_topic("t", 2)
        await engine.create_group("g", "t")
        joined = await http.post(
            "/consumer-groups/g/join", json={"member_id": "m", "session_timeout_secs": 0.05}
        )
        assert (await joined.json())["generation"] == 1
        await asyncio.sleep(0.1)  # the member's session has run out; only the stats route sees it
        woken = engine.group_store.notifier.waiter()
        stats = await (await http.get("/consumer-groups/g/stats")).json()
        assert (stats["generation"], stats["members"]) == (2, [])
        assert woken.is_set()  # waiting members learn of the rebalance
        assert engine.counters["rebalances"] == 2  # the join and the eviction
    await engine.close()
    again = StreamsService(StreamsConfig(data_dir=tmp_path))
    again.open()
    assert again.group("g").generation == 2  # saved
    await again.close()


def durable_state(service: StreamsService) -> dict[str, Any]:
    """Everything a restart must keep: topics and their records, rooms, groups, idempotency answers."""
    topics = {
        name: [
            (
                p.start_offset,
                p.next_offset,
                [(e.offset, e.body.id, e.body.data) for e in topic.read(i, 0, 100)],
            )
            for i, p in enumerate(topic.partitions)
        ]
        for name, topic in service.topic_store.topics.items()
    }
    rooms = {
        name: (room.settings(), [(e.offset, e.body.id) for e in room.read(room.oldest, 100)])
        for name, room in service.rooms.items()
    }
    groups = {name: group.snapshot() for name, group in service.groups.items()}
    return {"topics": topics, "rooms": rooms, "groups": groups, "answers": dict(service.idempotency.entries)}


async def create_topic(s: StreamsService) -> None:
    await s.create_topic("new", 3)


async def grow_topic(s: StreamsService) -> None:
    await s.add_partitions("t", 4)


async def delete_topic(s: StreamsService) -> None:
    await s.delete_topic("t")


async def publish_topic(s: StreamsService) -> None:
    await s.publish_topic("t", [event(10), event(11), event(12)])


async def publish_once(s: StreamsService) -> None:
    await s.publish_topic("t", [event(20)], idempotency_key="once")


async def create_room(s: StreamsService) -> None:
    await s.create_room("other", max_events=7, retention_secs=60.0)


async def publish_room(s: StreamsService) -> None:
    await s.publish_room("r", "said", {"x": 1})


async def delete_room(s: StreamsService) -> None:
    await s.delete_room("r")


async def create_group(s: StreamsService) -> None:
    await s.create_group("g2", "t", strategy="range")


async def delete_group(s: StreamsService) -> None:
    await s.delete_group("g")


async def join_group(s: StreamsService) -> None:
    s.group_store.join("g", "m2", None)


async def leave_group(s: StreamsService) -> None:
    s.group_store.leave("g", "m1")


async def commit(s: StreamsService) -> None:
    generation = s.group("g").generation
    await s.commit("g", 0, 1, "m1", generation)


async def expire_member(s: StreamsService) -> None:
    s.group_store.join("g", "short", 0.01)
    await asyncio.sleep(0.02)
    await s.group_stats("g")  # an eviction noticed by reading


@pytest.mark.parametrize(
    "change",
    [
        create_topic,
        grow_topic,
        delete_topic,
        publish_topic,
        publish_once,
        create_room,
        publish_room,
        delete_room,
        create_group,
        delete_group,
        join_group,
        leave_group,
        commit,
        expire_member,
    ],
)
async def test_every_kind_of_change_survives_a_restart(tmp_path: Path, change: Any) -> None:
    config = StreamsConfig(data_dir=tmp_path, cleanup_interval=3600)
    service = StreamsService(config)
    service.open()
    await service.create_topic("t", 2)
    await service.publish_topic("t", [event(1), event(2)])
    await service.publish_room("r", "hello", {"n": 1})
    await service.create_group("g", "t")
    service.group_store.join("g", "m1", None)
    before = durable_state(service)
    await change(service)
    changed = durable_state(service)
    assert changed != before, "the change changed nothing"
    await service.close()
    again = StreamsService(config)
    again.open()
    try:
        assert durable_state(again) == changed
    finally:
        await again.close()


async def test_a_crash_that_lost_the_answers_tail_does_not_let_a_retry_append_again(tmp_path: Path) -> None:
    """Power lost after the events reached the log but before their answer reached idempotency.log
    (the two are fsynced apart): the answer is rebuilt from the events' marks, and a retry appends
    nothing. Lost the other way round (the answer on disk, the events not), the answer is dropped and
    the retry appends them."""
    engine = StreamsService(StreamsConfig(data_dir=tmp_path))
    engine.open()
    await engine.create_topic("t", 3)
    await engine.publish_topic("t", [event(0)], idempotency_key="kept")
    answers = (tmp_path / "idempotency.log").read_bytes()
    spread = [event(i, key=f"k{i}") for i in range(1, 9)]  # over the three partitions
    first = await engine.publish_topic("t", spread, idempotency_key="spread")
    assert len({p for p, _ in first}) > 1
    crash(engine)
    (tmp_path / "idempotency.log").write_bytes(answers)  # the answer's record lost
    again = StreamsService(StreamsConfig(data_dir=tmp_path))
    again.open()
    assert await again.publish_topic("t", spread, idempotency_key="spread") == first
    assert sum(p.next_offset for p in again.topics["t"].partitions) == 9
    partition = again.topics["t"].choose_partition("k9", None)
    (segment,) = (tmp_path / "topics" / "t" / str(partition)).glob("*.log")
    size = segment.stat().st_size
    published = await again.publish_topic("t", [event(9, key="k9")], idempotency_key="gone")
    ((_, offset),) = published
    crash(again)
    os.truncate(segment, size)  # the event lost, its answer kept
    third = StreamsService(StreamsConfig(data_dir=tmp_path))
    third.open()
    assert third.topics["t"].partitions[partition].next_offset == offset
    assert await third.publish_topic("t", [event(9, key="k9")], idempotency_key="gone") == published  # anew
    assert third.topics["t"].partitions[partition].next_offset == offset + 1
    await third.close()


async def test_the_answers_are_on_disk_before_a_segment_holding_their_events_is_sealed(
    tmp_path: Path,
) -> None:
    """After a crash only the active segments are searched for marks: so a roll syncs the answers
    before it seals the segment it leaves."""
    config = StreamsConfig(data_dir=tmp_path, fsync="interval", fsync_interval_ms=600_000)  # none meanwhile
    engine = StreamsService(config)
    engine.open()
    await engine.create_topic("t", 1, segment_bytes=1024)
    with FaultInjector(tmp_path).installed() as seen:
        for i in range(100):
            await engine.publish_topic("t", [event(i)], idempotency_key=f"k{i}")
    fsyncs = [Path(path).name for operation, path in seen.seen if operation == "fsync"]
    assert len(engine.topics["t"].partitions[0].segments) > 2
    rolls = [i for i, name in enumerate(fsyncs) if name.endswith(".log") and name != "idempotency.log"]
    assert rolls
    assert all(fsyncs[i - 1] == "idempotency.log" for i in rolls), fsyncs
    await engine.close()
