"""Several `meshplane serve --storage nats://...` against one JetStream: one set of topics and groups.

The contract tests of ``test_streams_server.py`` run on this backend too; these pin what only a
shared backend has: what one server does, another sees, and either can go.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator

import nats
import pytest

from meshplane.core.streamlog import scan_records
from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import Conflict, NotFound, StreamError
from meshplane.streams.jetstream import naming
from tests.helpers import eventually


@pytest.fixture
def jetstream() -> Iterator[NatsServer]:
    with NatsServer(jetstream=True) as server:
        yield server.start()


@pytest.fixture
def two_servers(jetstream: NatsServer) -> Iterator[tuple[StreamsServerProcess, StreamsServerProcess]]:
    args = ("--storage", jetstream.url)
    with StreamsServerProcess(extra_args=args) as a, StreamsServerProcess(extra_args=args) as b:
        yield a.start(), b.start()


@pytest.fixture
async def clients(
    two_servers: tuple[StreamsServerProcess, StreamsServerProcess],
) -> AsyncIterator[tuple[StreamsClient, StreamsClient]]:
    a, b = two_servers
    async with StreamsClient(a.url) as ca, StreamsClient(b.url) as cb:
        yield ca, cb


async def test_events_are_stored_in_one_jetstream_stream_per_partition(
    jetstream: NatsServer, clients: tuple[StreamsClient, StreamsClient]
) -> None:
    a, _ = clients
    await a.create_topic("orders.eu:1", 2)
    await a.publish_batch("orders.eu:1", [{"event_type": "e", "data": i} for i in range(5)], partition=1)
    nc = await nats.connect(jetstream.url)
    try:
        info = await nc.jetstream().stream_info(naming.partition_stream("orders.eu:1", 1))
        assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (5, 1, 5)
        empty = await nc.jetstream().stream_info(naming.partition_stream("orders.eu:1", 0))
        assert empty.state.messages == 0
    finally:
        await nc.close()


async def test_a_topic_written_through_one_server_is_read_through_another(
    clients: tuple[StreamsClient, StreamsClient],
) -> None:
    a, b = clients
    await a.create_topic("shared", 1)
    await eventually(lambda: _has_topic(b, "shared"), what="the topic seen by the other server")
    places = await a.publish_batch("shared", [{"event_type": "e", "data": i} for i in range(10)])
    assert [o for _, o in places] == list(range(10))
    answer = await b.consume_partition("shared", 0, 3, 100)
    assert [e["data"] for e in answer["events"]] == list(range(3, 10))
    assert (await b.topic_stats("shared"))["partitions"][0]["next_offset"] == 10
    with pytest.raises(Conflict):
        await b.create_topic("shared", 1)


async def _has_topic(client: StreamsClient, name: str) -> bool:
    try:
        await client.topic_stats(name)
    except NotFound:
        return False
    return True


async def test_a_retry_through_another_server_appends_nothing(
    clients: tuple[StreamsClient, StreamsClient],
) -> None:
    a, b = clients
    await a.create_topic("payments", 4)
    await eventually(lambda: _has_topic(b, "payments"))
    batch = [{"event_type": "paid", "data": i} for i in range(8)]
    first = await a.publish_batch("payments", batch, idempotency_key="req-1")
    again = await b.publish_batch("payments", batch, idempotency_key="req-1")
    assert again == first
    stats = await b.topic_stats("payments")
    assert sum(p["next_offset"] for p in stats["partitions"]) == 8


async def test_group_state_and_fencing_hold_across_servers(
    clients: tuple[StreamsClient, StreamsClient],
) -> None:
    a, b = clients
    await a.create_topic("jobs", 2)
    await eventually(lambda: _has_topic(b, "jobs"))
    await a.create_group("workers", "jobs", strategy="range", session_timeout_secs=30)
    first = await a.join("workers", member_id="m1")
    assert (first["generation"], first["partitions"]) == (1, [0, 1])
    second = await b.join("workers", member_id="m2")  # through the other server: the same group
    assert second["generation"] == 2
    assert (await a.assignment("workers", "m1"))["partitions"] == [0]
    with pytest.raises(Conflict, match="stale"):  # m1's old generation is fenced by the other server
        await b.commit("workers", 0, 5, member_id="m1", generation=1)
    await b.commit("workers", 0, 5, member_id="m1", generation=2)
    assert await a.committed("workers", 0) == 5
    with pytest.raises(Conflict, match="does not own"):
        await a.commit("workers", 0, 6, member_id="m2", generation=2)


async def test_concurrent_joins_through_two_servers_lose_no_member(
    clients: tuple[StreamsClient, StreamsClient],
) -> None:
    a, b = clients
    await a.create_topic("busy", 8)
    await eventually(lambda: _has_topic(b, "busy"))
    await a.create_group("crowd", "busy", session_timeout_secs=30)
    members = [f"m{i}" for i in range(12)]
    await asyncio.gather(*((a if i % 2 else b).join("crowd", member_id=m) for i, m in enumerate(members)))
    stats = await b.group_stats("crowd")
    assert sorted(stats["members"]) == sorted(members)
    assert stats["generation"] == len(members)  # every join was its own rebalance, none overwritten
    owned = sorted(p for parts in stats["assignment"].values() for p in parts)
    assert owned == list(range(8))


async def test_when_a_server_dies_its_clients_continue_on_another(
    two_servers: tuple[StreamsServerProcess, StreamsServerProcess],
) -> None:
    first, second = two_servers
    async with (
        StreamsClient([first.url, second.url], channel=True) as client,
        StreamsClient(f"{first.url},{second.url}") as rest,
    ):
        await client.create_topic("orders", 1)
        await client.create_group("g", "orders", session_timeout_secs=30)
        member = await client.join("g", member_id="w")
        acked = await client.publish_batch("orders", [{"event_type": "e", "data": i} for i in range(20)])
        await client.commit("g", 0, 12, member_id="w", generation=member["generation"])
        first.kill(signal.SIGKILL)
        with pytest.raises(StreamError):  # the request in flight when its server died: the caller's
            await client.heartbeat("g", "w")
        assert await rest.committed("g", 0) == 12  # a new request goes to the server still there
        assert rest.url == second.url
        answer = await rest.consume_partition("orders", 0, 0, 100)
        assert [(0, e["offset"]) for e in answer["events"]] == acked
        heartbeat = await client.heartbeat("g", "w")  # the command channel reopens on the other
        assert heartbeat["generation"] == member["generation"]
        await client.commit("g", 0, 20, member_id="w", generation=heartbeat["generation"])
        assert await rest.committed("g", 0) == 20


async def test_spark_readers_asking_for_local_reads_are_served_over_http(
    two_servers: tuple[StreamsServerProcess, StreamsServerProcess],
    clients: tuple[StreamsClient, StreamsClient],
) -> None:
    """No segment file holds the records here: an executor next to the server reads them over HTTP."""
    from meshplane.spark.http import SyncStreamsClient

    a, _ = clients
    await a.create_topic("read-here", 1)
    await a.publish_batch("read-here", [{"event_type": "e", "data": i} for i in range(50)])
    local = SyncStreamsClient(two_servers[0].url, local_reads=True)
    remote = SyncStreamsClient(two_servers[0].url)
    try:
        data, start, end = await asyncio.to_thread(local.fetch_raw, "read-here", 0, 10, 1 << 20)
        over_http, _, _ = await asyncio.to_thread(remote.fetch_raw, "read-here", 0, 10, 1 << 20)
        assert (start, end) == (0, 50)
        assert bytes(data) == bytes(over_http)
        assert len(scan_records(bytes(data)).records) == 40
    finally:
        local.close()
        remote.close()
