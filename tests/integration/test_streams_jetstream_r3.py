"""Topics, groups and a room replicated three ways on a three-node JetStream cluster, while nodes die.

Publishers retry every batch under its idempotency key until it is acknowledged, as a client of a
replicated log does; a consumer group reads and commits throughout; a room gets events through one
server while a subscriber of the other is pushed them. Whatever is killed, every acknowledged event
stays at its offset, no event is stored twice, the group goes on, and the pushed room events are
the room's, in order, with no gap.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import aiohttp
import nats
import pytest

from meshplane.launchers import JetStreamCluster, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import StreamError
from meshplane.streams.jetstream import naming
from tests.helpers import eventually
from tests.support.servers import start_together

PARTITIONS = 2
BATCH = 5
RETRYABLE = (StreamError, aiohttp.ClientError, TimeoutError)


@pytest.fixture
def cluster() -> Iterator[JetStreamCluster]:
    with JetStreamCluster(3) as nodes:
        yield nodes.start()


@pytest.fixture
def servers(cluster: JetStreamCluster) -> Iterator[list[StreamsServerProcess]]:
    args = ("--storage", ",".join(cluster.urls), "--replicas", "3")
    with StreamsServerProcess(extra_args=args) as a, StreamsServerProcess(extra_args=args) as b:
        yield start_together(a, b)


class Publisher:
    """Batches of (name, i) events, each retried under one idempotency key until acknowledged."""

    def __init__(self, client: StreamsClient, name: str) -> None:
        self.client, self.name = client, name
        self.acked: dict[tuple[int, int], Any] = {}
        self.retries = 0

    async def run(self, stop: asyncio.Event) -> None:
        batch_number = 0
        while not stop.is_set():
            events = [
                {"event_type": "e", "data": [self.name, batch_number * BATCH + i]} for i in range(BATCH)
            ]
            while True:
                try:
                    places = await self.client.publish_batch(
                        "orders", events, idempotency_key=f"{self.name}-{batch_number}"
                    )
                    break
                except RETRYABLE:
                    self.retries += 1
                    await asyncio.sleep(0.1)
            for place, event in zip(places, events, strict=True):
                assert place not in self.acked, f"{place} acknowledged twice"
                self.acked[place] = event["data"]
            batch_number += 1


class RoomPublisher:
    """Events published one by one to room ``chat``; a failed one is not retried (rooms take no
    idempotency key), so none can be stored twice."""

    def __init__(self, client: StreamsClient) -> None:
        self.client = client
        self.acked: dict[int, int] = {}  # offset -> n
        self.failed = 0

    async def run(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            try:
                offset = await self.client.publish("chat", "said", n)
                assert offset not in self.acked, f"room offset {offset} acknowledged twice"
                self.acked[offset] = n
            except RETRYABLE:
                self.failed += 1
                await asyncio.sleep(0.1)
            n += 1
            await asyncio.sleep(0.005)


class RoomWatcher:
    """Pushed room events, through the server that is not killed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.received: list[tuple[int, int]] = []

    async def run(self) -> None:
        async with StreamsClient(self.url) as client:
            async for event in client.subscribe("chat", "watcher", from_offset=0):
                self.received.append((event["offset"], event["data"]))


class Consumer:
    """One member of group ``g``: reads what it owns from the committed offset and commits."""

    def __init__(self, client: StreamsClient) -> None:
        self.client = client
        self.seen: dict[tuple[int, int], Any] = {}
        self.committed: dict[int, int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        member = await _retry(lambda: self.client.join("g", member_id="w"))
        generation = member["generation"]
        while not stop.is_set():
            try:
                generation = (await self.client.heartbeat("g", "w"))["generation"]
                for partition in range(PARTITIONS):
                    start = self.committed.get(partition, 0)
                    answer = await self.client.consume_partition("orders", partition, start, 200)
                    for event in answer["events"]:
                        self.seen[(partition, event["offset"])] = event["data"]
                    if answer["events"]:
                        end = answer["events"][-1]["offset"] + 1
                        await self.client.commit("g", partition, end, member_id="w", generation=generation)
                        self.committed[partition] = end
            except RETRYABLE:
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.02)


async def _retry(call: Any, timeout: float = 60) -> Any:
    """``call()`` again while the cluster refuses it (an election): at most ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await call()
        except RETRYABLE as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"still refused after {timeout:g}s: {exc!r}") from exc
            await asyncio.sleep(0.1)


async def _stream_leader(cluster: JetStreamCluster, partition: int) -> str:
    nc = await nats.connect(cluster.urls)
    try:
        info = await nc.jetstream().stream_info(naming.partition_stream("orders", partition))
        assert info.cluster is not None
        assert info.cluster.leader is not None
        return info.cluster.leader
    finally:
        await nc.close()


@pytest.mark.timeout(480)  # five phases of at most 2 x 30 s, the set-up's retries and the final read
async def test_r3_loses_and_duplicates_nothing_when_a_node_then_a_stream_leader_is_killed(
    cluster: JetStreamCluster, servers: list[StreamsServerProcess]
) -> None:
    urls = [server.url for server in servers]
    async with StreamsClient(urls) as client:
        await _retry(lambda: client.create_topic("orders", PARTITIONS))
        await _retry(lambda: client.create_group("g", "orders", session_timeout_secs=60))
        await _retry(lambda: client.create_room("chat", max_events=100_000))
        publishers = [Publisher(client, f"p{i}") for i in range(2)]
        consumer = Consumer(client)
        room_publisher, watcher = RoomPublisher(client), RoomWatcher(servers[1].url)
        publishing, consuming = asyncio.Event(), asyncio.Event()
        watching = asyncio.create_task(watcher.run())
        tasks = [asyncio.create_task(p.run(publishing)) for p in publishers]
        tasks.append(asyncio.create_task(room_publisher.run(publishing)))
        tasks.append(asyncio.create_task(consumer.run(consuming)))

        def acked() -> int:
            return sum(len(p.acked) for p in publishers)

        async def progress(events: int, what: str) -> None:
            target, consumed = acked() + events, len(consumer.seen)
            await eventually(lambda: acked() >= target, timeout=30, what=f"{what}: publishers go on")
            await eventually(lambda: len(consumer.seen) > consumed, timeout=30, what=f"{what}: group goes on")

        try:
            await progress(100, "before any failure")
            leader = await _stream_leader(cluster, 0)
            follower = next(node for node in cluster.nodes if node.name != leader)
            follower.kill(signal.SIGKILL)
            await progress(100, "a follower killed")
            follower.start()
            await progress(50, "the follower back")

            cluster.node(leader).kill(signal.SIGKILL)
            await progress(100, f"the leader of partition 0 ({leader}) killed")
            assert await _stream_leader(cluster, 0) != leader
            cluster.node(leader).start()

            servers[0].kill(signal.SIGKILL)  # the client's first server: it moves to the other
            await progress(100, "a streams server killed")
        finally:
            publishing.set()
            results = await asyncio.gather(*tasks[:-1], return_exceptions=True)
        assert not [r for r in results if isinstance(r, BaseException)], results

        every_acked = {place: data for p in publishers for place, data in p.acked.items()}
        stored: dict[tuple[int, int], Any] = {}
        ends = {}
        for partition in range(PARTITIONS):
            offset = 0
            while events := (await client.consume_partition("orders", partition, offset, 1000))["events"]:
                stored.update({(partition, e["offset"]): e["data"] for e in events})
                offset = events[-1]["offset"] + 1
            # offsets are contiguous from 0: nothing was lost in the middle
            assert sorted(o for p, o in stored if p == partition) == list(range(offset))
            ends[partition] = offset
        assert {place: stored.get(place) for place in every_acked} == every_acked  # at their offsets
        datas = [tuple(d) for d in stored.values()]
        assert len(datas) == len(set(datas)), "an event was stored twice"
        assert sum(p.retries for p in publishers) > 0  # the failures were felt, and retried through

        try:
            await eventually(lambda: consumer.committed == ends, timeout=60, what="the group reads all")
        finally:
            consuming.set()
            await tasks[-1]
        assert {p: await client.committed("g", p) for p in ends} == ends
        assert all(stored[place] == data for place, data in consumer.seen.items())

        room: list[tuple[int, int]] = []
        while page := (await client.history("chat", from_offset=len(room), limit=1000))["events"]:
            room.extend((e["offset"], e["data"]) for e in page)
        assert [offset for offset, _ in room] == list(range(len(room)))  # contiguous from 0
        assert {o: n for o, n in room if o in room_publisher.acked} == room_publisher.acked
        assert len({n for _, n in room}) == len(room), "a room event was stored twice"
        await eventually(lambda: len(watcher.received) == len(room), what="the watcher pushed every event")
        watching.cancel()
        assert watcher.received == room  # pushed in order, with no gap, through the other server


@pytest.mark.timeout(300)  # three phases of at most 30 s, a meta leader within 30 s, retries of 60 s
async def test_publishes_answer_only_200_or_503_while_the_meta_leader_then_a_stream_leader_die(
    cluster: JetStreamCluster, servers: list[StreamsServerProcess]
) -> None:
    """Each answer a client can act on: stored, or a JSON 503 to retry (never a bare 500)."""
    async with StreamsClient([servers[0].url]) as client:
        await _retry(lambda: client.create_topic("orders", PARTITIONS))
    answers: dict[int, int] = {}
    bodies_not_json: list[str] = []
    stop = asyncio.Event()

    async def publish(http: aiohttp.ClientSession, name: str) -> None:
        batch = 0
        while not stop.is_set():
            events = [{"event_type": "e", "data": [name, batch, i]} for i in range(BATCH)]
            body = {"events": events, "idempotency_key": f"{name}-{batch}"}
            async with http.post(f"{servers[0].url}/topics/orders/publish", json=body) as response:
                answers[response.status] = answers.get(response.status, 0) + 1
                if response.status != 200:
                    try:
                        await response.json()
                    except (aiohttp.ContentTypeError, ValueError):
                        bodies_not_json.append(await response.text())
                else:
                    batch += 1

    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(publish(http, f"p{i}")) for i in range(4)]

        async def stored(count: int) -> None:
            target = answers.get(200, 0) + count
            await eventually(lambda: answers.get(200, 0) >= target, timeout=30, what="publishes go on")

        try:
            await stored(20)
            meta = await asyncio.to_thread(cluster.wait_meta_leader)
            cluster.node(meta).kill(signal.SIGKILL)
            await stored(20)
            cluster.node(meta).start()
            leader = await _retry(lambda: _stream_leader(cluster, 0))
            cluster.node(leader).kill(signal.SIGKILL)
            await stored(20)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    assert set(answers) <= {200, 503}, answers
    assert not bodies_not_json
