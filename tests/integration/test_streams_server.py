"""`meshplane serve` as a real process: Synap's SDK, REST, WebSocket, SSE, errors, auth, crash recovery."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from synap_sdk import SynapClient, SynapConfig
from synap_sdk.exceptions import SynapException

from meshplane.core.streamlog import decode_event
from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import Conflict, NotFound, OffsetOutOfRange, StreamError
from tests.helpers import eventually

TOKEN = "s3cret-token"


SERVER_ARGS = ("--max-payload-bytes", "4096", "--room-max-events", "50")


@pytest.fixture(scope="module", params=["local", "jetstream"])
def storage(request: pytest.FixtureRequest) -> str:
    """Every test of a shared server runs on both storage backends: the local log, and JetStream."""
    return str(request.param)


@contextmanager
def streams_server(storage: str) -> Iterator[StreamsServerProcess]:
    """A server on ``storage``; on JetStream, its own nats-server (names repeat across servers)."""
    with contextlib.ExitStack() as stack:
        args: tuple[str, ...] = SERVER_ARGS
        if storage == "jetstream":
            nats = stack.enter_context(NatsServer(jetstream=True)).start()
            args = (*args, "--storage", nats.url)
        server = stack.enter_context(StreamsServerProcess(extra_args=args)).start()
        yield server
        server.stop()
        # whatever the tests sent, the server's own work (upkeep each second, shutdown) never failed
        assert "Traceback" not in server.log_path.read_text()


@pytest.fixture(scope="module")
def server(storage: str) -> Iterator[StreamsServerProcess]:
    with streams_server(storage) as proc:
        yield proc


@pytest.fixture(scope="module")
def channel_server(storage: str) -> Iterator[StreamsServerProcess]:
    with streams_server(storage) as proc:
        yield proc


@pytest.fixture(params=[False, True], ids=["rest", "channel"])
async def client(request: pytest.FixtureRequest, storage: str) -> AsyncIterator[StreamsClient]:
    """Every client test runs twice, against its own server (names repeat): each call an HTTP
    request, and with publishes and group calls as commands over the WebSocket."""
    server = request.getfixturevalue("channel_server" if request.param else "server")
    async with StreamsClient(server.url, channel=request.param) as c:
        yield c


@pytest.fixture
async def http(request: pytest.FixtureRequest, storage: str) -> AsyncIterator[aiohttp.ClientSession]:
    """Raw HTTP to the server the test's ``client`` talks to (``server`` when it has none)."""
    over_channel = "client" in request.fixturenames and request.node.callspec.params["client"]
    server = request.getfixturevalue("channel_server" if over_channel else "server")
    async with aiohttp.ClientSession(server.url) as session:
        yield session


# --- synap-sdk, unchanged, over http:// -------------------------------------------------------------


async def test_synap_sdk_rooms(server: StreamsServerProcess) -> None:
    async with SynapClient(SynapConfig(server.url)) as synap:
        assert (await synap.health())["status"] == "healthy"
        assert await synap.stream.get_or_create_room("sdk-room") is True
        assert await synap.stream.get_or_create_room("sdk-room") is False
        offsets = [await synap.stream.publish("sdk-room", "message", {"n": i}) for i in range(5)]
        assert offsets == [0, 1, 2, 3, 4]
        events = await synap.stream.read("sdk-room", offset=2)
        assert [(e.offset, e.event, e.data) for e in events] == [
            (i, "message", {"n": i}) for i in range(2, 5)
        ]
        assert all(e.timestamp > 1_700_000_000 for e in events)
        stats = await synap.stream.stats("sdk-room")
        assert (stats["message_count"], stats["min_offset"], stats["max_offset"]) == (5, 0, 4)
        assert "sdk-room" in await synap.stream.list_rooms()
        with pytest.raises(SynapException, match="already exists"):
            await synap.stream.create_room("sdk-room")
        await synap.stream.delete_room("sdk-room")
        assert "sdk-room" not in await synap.stream.list_rooms()


async def test_synap_sdk_pubsub(server: StreamsServerProcess) -> None:
    async with SynapClient(SynapConfig(server.url)) as synap:
        assert await synap.pubsub.publish("alerts.cpu", {"v": 1}) == 0
        await synap.pubsub.subscribe_topics("sub-1", ["alerts.*"])
        await synap.pubsub.subscribe_topics("sub-2", ["alerts.#", "other"])
        assert await synap.pubsub.publish("alerts.cpu", {"v": 2}) == 2
        assert await synap.pubsub.publish("alerts.cpu.core1", {"v": 3}) == 1  # only '#' spans words
        await synap.pubsub.unsubscribe_topics("sub-1", ["alerts.*"])
        assert await synap.pubsub.publish("alerts.cpu", {"v": 4}) == 1
        assert "alerts.cpu" in await synap.pubsub.list_topics()


async def test_command_endpoint_envelope(http: aiohttp.ClientSession) -> None:
    async with http.post("/api/v1/command", json={"command": "stream.list", "request_id": "r-1"}) as r:
        body = await r.json()
    assert r.status == 200
    assert body["success"] is True
    assert body["request_id"] == "r-1"
    assert isinstance(body["payload"], dict)
    assert body["error"] is None
    async with http.post(
        "/api/v1/command", json={"command": "stream.stats", "request_id": "r-2", "payload": {"room": "nope"}}
    ) as r:
        body = await r.json()
    assert r.status == 200
    assert body == {
        "success": False,
        "request_id": "r-2",
        "payload": None,
        "error": "Invalid request: room 'nope' not found",
        "code": 404,
        "type": "NotFound",
    }
    async with http.post("/api/v1/command", json={"command": "kv.set", "payload": {}}) as r:
        assert "unknown command" in (await r.json())["error"]


async def test_command_websocket_answers_each_frame_and_survives_bad_ones(
    http: aiohttp.ClientSession,
) -> None:
    publish = {"command": "stream.publish", "payload": {"room": "wsc", "event": "e", "data": 1}}
    async with http.ws_connect("/api/v1/ws") as ws:
        await ws.send_json({**publish, "request_id": 1})
        await ws.send_str("{not json")
        await ws.send_bytes(b"\x00\x01")
        await ws.send_json({"command": "stream.stats", "request_id": "two", "payload": {"room": "nope"}})
        await ws.send_json(["a", "list"])
        await ws.send_json(
            {"command": "group.commit", "request_id": 3, "payload": {"group": "g", "offset": "x"}}
        )
        await ws.send_json({**publish, "request_id": 4})
        answers = [await ws.receive_json(timeout=10) for _ in range(7)]
    first = answers[0]
    assert (first["success"], first["request_id"], first["error"]) == (True, 1, None)
    assert (first["payload"]["offset"], first["payload"]["room"]) == (0, "wsc")
    assert (answers[1]["success"], answers[1]["code"], answers[1]["request_id"]) == (False, 400, None)
    assert "not valid JSON" in answers[1]["error"]
    assert "text frames" in answers[2]["error"]
    assert (answers[3]["request_id"], answers[3]["code"], answers[3]["type"]) == ("two", 404, "NotFound")
    assert "must be a JSON object" in answers[4]["error"]
    assert answers[5]["request_id"] == 3
    assert "partition_id" in answers[5]["error"]
    assert (answers[6]["success"], answers[6]["payload"]["offset"]) == (
        True,
        1,
    )  # still serving, nothing lost


async def test_command_channel_carries_concurrent_calls(server: StreamsServerProcess) -> None:
    async with StreamsClient(server.url, channel=True) as c:
        await c.create_topic("piped", 1)
        places = await asyncio.gather(*(c.publish_to_topic("piped", "e", {"i": i}) for i in range(200)))
        assert sorted(places) == [(0, o) for o in range(200)]
        page = await c.consume_partition("piped", 0, 0, 1000)
        by_offset = {e["offset"]: e["data"]["i"] for e in page["events"]}
        assert by_offset == {o: i for i, (_, o) in enumerate(places)}  # each caller got its own answer


# --- rooms ----------------------------------------------------------------------------------------


async def test_room_history_replay_and_relative_offsets(client: StreamsClient) -> None:
    for i in range(10):
        assert await client.publish("hist", "tick", {"i": i}, metadata={"src": "test"}) == i
    history = await client.history("hist", from_offset=3, to_offset=6)
    assert [e["offset"] for e in history["events"]] == [3, 4, 5, 6]
    assert (history["oldest_offset"], history["newest_offset"]) == (0, 9)
    assert history["events"][0]["metadata"] == {"src": "test"}
    last3 = await client.consume("hist", "reader", from_offset=-3)
    assert [e["data"]["i"] for e in last3["events"]] == [7, 8, 9]
    assert last3["next_offset"] == 10


async def test_room_ring_keeps_max_events_and_reports_out_of_range(client: StreamsClient) -> None:
    for i in range(60):  # the server keeps 50 per room
        await client.publish("ring", "tick", i)
    stats = await client.room_stats("ring")
    assert (stats["min_offset"], stats["max_offset"], stats["message_count"]) == (10, 59, 50)
    with pytest.raises(OffsetOutOfRange) as info:
        await client.consume("ring", "late", from_offset=5)
    assert (info.value.requested, info.value.oldest, info.value.newest) == (5, 10, 59)


async def test_websocket_replays_then_pushes_in_order(client: StreamsClient) -> None:
    for i in range(5):
        await client.publish("live", "m", i)
    received: list[dict[str, Any]] = []

    async def subscriber() -> None:
        async for event in client.subscribe("live", "ws-1", from_offset=-2):
            received.append(event)
            if len(received) == 7:
                return

    task = asyncio.create_task(subscriber())
    await eventually(lambda: len(received) == 2, what="replay of the last two")
    stats = await client.room_stats("live")
    assert stats["live_subscribers"] == 1
    for i in range(5, 10):
        await client.publish("live", "m", i)
    await asyncio.wait_for(task, 10)
    assert [e["offset"] for e in received] == [3, 4, 5, 6, 7, 8, 9]
    assert [e["data"] for e in received] == [3, 4, 5, 6, 7, 8, 9]
    assert received[0]["event"] == "m"
    assert received[0]["timestamp"] > 0


async def test_websocket_frames_match_synap(client: StreamsClient) -> None:
    await client.publish("frames", "hello", {"a": 1})
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(client.url.replace("http", "ws") + "/stream/frames/ws/sub-9?from_offset=0") as ws,
    ):
        connected = json.loads((await ws.receive(timeout=5)).data)
        assert connected == {
            "type": "connected",
            "room": "frames",
            "subscriber_id": "sub-9",
            "from_offset": 0,
        }
        event = json.loads((await ws.receive(timeout=5)).data)
        assert {k: event[k] for k in ("type", "offset", "event", "data")} == {
            "type": "event",
            "offset": 0,
            "event": "hello",
            "data": {"a": 1},
        }


async def test_pushed_frames_of_every_length_reach_plain_and_compressed_subscribers() -> None:
    """Caught-up plain sockets get one prebuilt frame per event (7-bit, 16-bit and 64-bit lengths);
    a subscriber that negotiated compression gets the same events through aiohttp's writer."""
    sizes = [10, 200, 70_000, 5]
    with StreamsServerProcess(extra_args=("--max-payload-bytes", "200000")) as proc:
        proc.start()
        ws_url = proc.url.replace("http", "ws") + "/stream/sizes/ws/"
        async with StreamsClient(proc.url) as c, aiohttp.ClientSession() as session:
            await c.create_room("sizes")
            async with (
                session.ws_connect(ws_url + "plain") as plain,
                session.ws_connect(ws_url + "zipped", compress=15) as zipped,
            ):
                for ws in (plain, zipped):
                    assert (await ws.receive_json(timeout=5))["type"] == "connected"
                await eventually(lambda: _live(c, "sizes", 2), what="both subscribers registered")
                for n in sizes:
                    await c.publish("sizes", "blob", "x" * n)
                for ws in (plain, zipped):
                    events = [await ws.receive_json(timeout=10) for _ in sizes]
                    assert [(e["offset"], len(e["data"])) for e in events] == list(enumerate(sizes))
            assert zipped.compress == 15


async def _live(client: StreamsClient, room: str, count: int) -> bool:
    return bool((await client.room_stats(room))["live_subscribers"] == count)


async def test_pubsub_websocket_pushes_matching_messages(client: StreamsClient) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(client.url.replace("http", "ws") + "/pubsub/ws?topics=orders.*") as ws,
    ):
        assert json.loads((await ws.receive(timeout=5)).data)["type"] == "connected"
        assert await client.pubsub_publish("orders.new", {"id": 1}) == 1
        assert await client.pubsub_publish("users.new", {"id": 2}) == 0
        message = json.loads((await ws.receive(timeout=5)).data)
        assert (message["type"], message["topic"], message["payload"]) == ("message", "orders.new", {"id": 1})


async def test_server_sent_events_resume_after_last_event_id(client: StreamsClient) -> None:
    for i in range(4):
        await client.publish("sse", "tick", i)
    async with (
        aiohttp.ClientSession() as session,
        session.get(client.url + "/events/sse", headers={"Last-Event-ID": "1"}) as response,
    ):
        assert response.headers["Content-Type"].startswith("text/event-stream")
        frames: list[str] = []
        while len(frames) < 2:
            frames.append((await response.content.readuntil(b"\n\n")).decode())
    assert frames[0].startswith("id: 2\nevent: tick\ndata: ")
    assert json.loads(frames[1].split("data: ", 1)[1])["data"] == 3


# --- topics and groups ----------------------------------------------------------------------------


async def test_keyed_events_land_where_synap_puts_them(client: StreamsClient) -> None:
    await client.create_topic("orders", 3)
    for customer in ("customer-123", "customer-7", "alice"):
        partition, _ = await client.publish_to_topic("orders", "order.created", {"c": customer}, key=customer)
        assert partition == zlib.crc32(customer.encode()) % 3
    unkeyed = [(await client.publish_to_topic("orders", "page.view", {}))[0] for _ in range(6)]
    assert sorted(unkeyed) == [0, 0, 1, 1, 2, 2]  # round-robin
    stats = await client.topic_stats("orders")
    assert sum(p["message_count"] for p in stats["partitions"]) == 9
    p = zlib.crc32(b"alice") % 3
    events = (await client.consume_partition("orders", p, 0, 100))["events"]
    assert any(e["key"] == "alice" and e["data"] == {"c": "alice"} and e["partition_id"] == p for e in events)


async def test_any_bytes_are_a_key_stored_exactly_and_shown_as_key_base64_beside_a_null_key(
    client: StreamsClient, http: aiohttp.ClientSession
) -> None:
    await client.create_topic("bytekeys", 3)
    keys = [b"\xff\x00\xfe", b"\x80", "caf\u00e9".encode(), b""]
    for key in keys:  # the client sends bytes as key_base64; routed by crc32 of the bytes, as Kafka's
        partition, _ = await client.publish_to_topic("bytekeys", "e", key.hex(), key=key)
        assert partition == zlib.crc32(key) % 3
    shown = {}
    for p in range(3):
        for e in (await client.consume_partition("bytekeys", p, 0, 100))["events"]:
            shown[e["data"]] = e
    # Text keys are Synap's `key`; other bytes are `key_base64` beside a null `key`: a client that
    # knows only `key` sees an event without a key, never a wrong one.
    assert [(shown[d]["key"], shown[d].get("key_base64")) for d in ("ff00fe", "80", "636166c3a9", "")] == [
        (None, "/wD+"),
        (None, "gA=="),
        ("caf\u00e9", None),
        ("", None),
    ]
    for body, message in (
        ({"key": "a", "key_base64": "YQ=="}, "key and key_base64 both given"),
        ({"key_base64": "not base64!"}, "key_base64 is not base64"),
        ({"key": 5}, "key must be a string"),
    ):
        async with http.post("/topics/bytekeys/publish", json={"event_type": "e", "data": 1, **body}) as r:
            assert r.status == 400
            assert message in (await r.json())["error"]


async def test_batch_publish_and_partition_consume(client: StreamsClient) -> None:
    await client.create_topic("batched", 2)
    places = await client.publish_batch(
        "batched", [{"event_type": "e", "data": i} for i in range(100)], partition=1
    )
    assert places == [(1, i) for i in range(100)]
    page = await client.consume_partition("batched", 1, 40, 25)
    assert [e["data"] for e in page["events"]] == list(range(40, 65))
    assert (page["next_offset"], page["count"]) == (65, 25)


async def test_a_partition_on_an_event_of_a_batch_is_refused_not_ignored(
    http: aiohttp.ClientSession, client: StreamsClient
) -> None:
    await client.create_topic("placed", 2)
    events = [{"event_type": "e", "data": 1}, {"event_type": "e", "data": 2, "partition": 1}]
    async with http.post("/topics/placed/publish", json={"events": events}) as answer:
        assert answer.status == 400
        assert "events[1] has a partition" in (await answer.json())["error"]
    stats = await client.topic_stats("placed")
    assert sum(p["message_count"] for p in stats["partitions"]) == 0  # nothing of the batch stored


async def test_bulk_fetch_sends_whole_records_from_any_offset(client: StreamsClient) -> None:
    """The records route (sendfile from the segment files): whole records, in order, none twice."""
    await client.create_topic("bulk", 1, segment_bytes=4096)
    sent = ["x" * (i % 40 * 7) for i in range(200)]  # 0..273 bytes: several records per segment
    await client.publish_batch("bulk", [{"event_type": "e", "data": d} for d in sent])
    for start in (0, 1, 57, 199):
        fetched = await client.fetch("bulk", 0, start, max_bytes=1000)
        offsets = [r.offset for r in fetched.records]
        assert offsets
        assert offsets == list(range(start, start + len(offsets)))
        assert [decode_event(r.payload).data for r in fetched.records] == sent[start : offsets[-1] + 1]
        assert (fetched.log_start_offset, fetched.log_end_offset) == (0, 200)
    walked: list[int] = []
    while len(walked) < 200:
        walked += [r.offset for r in (await client.fetch("bulk", 0, len(walked), max_bytes=700)).records]
    assert walked == list(range(200))
    one = await client.fetch("bulk", 0, 39, max_bytes=10)  # the first record comes whole, however long
    assert [decode_event(r.payload).data for r in one.records] == [sent[39]]
    assert (await client.fetch("bulk", 0, 200)).records == []
    with pytest.raises(OffsetOutOfRange):
        await client.fetch("bulk", 0, 201)


async def test_consumer_group_flow_with_fencing(client: StreamsClient) -> None:
    await client.create_topic("jobs", 4)
    await client.create_group("workers", "jobs", strategy="range", session_timeout_secs=30)
    a = await client.join("workers", member_id="a")
    assert (a["generation"], a["partitions"]) == (1, [0, 1, 2, 3])
    b = await client.join("workers", member_id="b")
    assert b["generation"] == 2
    assert (await client.assignment("workers", "a"))["partitions"] == [0, 1]
    assert (await client.assignment("workers", "b"))["partitions"] == [2, 3]
    assert (await client.heartbeat("workers", "a"))["generation"] == 2
    with pytest.raises(Conflict, match="stale"):
        await client.commit("workers", 0, 10, member_id="a", generation=1)
    with pytest.raises(Conflict, match="does not own"):
        await client.commit("workers", 2, 10, member_id="a", generation=2)
    with pytest.raises(Conflict, match="live members"):
        await client.commit("workers", 0, 10)
    await client.commit("workers", 0, 10, member_id="a", generation=2)
    assert await client.committed("workers", 0) == 10
    assert await client.committed("workers", 1) is None
    await client.leave("workers", "b")
    stats = await client.group_stats("workers")
    assert (stats["generation"], stats["member_count"], stats["committed_partitions"]) == (3, 1, 1)
    assert stats["state"] == "Stable"
    with pytest.raises(NotFound):
        await client.heartbeat("workers", "b")


async def test_session_timeout_evicts_a_silent_member(client: StreamsClient) -> None:
    await client.create_topic("beats", 2)
    await client.create_group("beaters", "beats", session_timeout_secs=0.3)
    await client.join("beaters", member_id="quiet")
    await client.join("beaters", member_id="busy", session_timeout_secs=30)

    async def evicted() -> bool:
        return bool((await client.heartbeat("beaters", "busy"))["partitions"] == [0, 1])

    await eventually(evicted, timeout=10, interval=0.05, what="quiet member evicted")
    assert (await client.group_stats("beaters"))["members"] == ["busy"]


async def test_a_silent_member_is_evicted_when_no_one_calls(client: StreamsClient) -> None:
    """The server's own upkeep times sessions out: a group nobody touches still rebalances."""
    await client.create_topic("quiet-beats", 1)
    await client.create_group("alone", "quiet-beats", session_timeout_secs=0.3)
    await client.join("alone", member_id="quiet")

    async def evicted() -> bool:
        return bool((await client.group_stats("alone"))["members"] == [])

    await eventually(evicted, timeout=10, interval=0.1, what="the silent member evicted by the server")


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "fragment"),
    [
        ("POST", "/topics/bad-json/publish", b"{nope", 400, "not valid JSON"),
        ("POST", "/topics/x", b"[1, 2]", 400, "must be a JSON object"),
        (
            "POST",
            "/topics/wrong-type",
            b'{"num_partitions": "three"}',
            400,
            "num_partitions must be an integer",
        ),
        ("POST", "/topics/zero", b'{"num_partitions": 0}', 400, "1..10000"),
        ("POST", "/topics/../etc", b"{}", 404, ""),
        ("POST", "/topics/bad%20name", b"{}", 400, "invalid topic name"),
        ("POST", "/topics/nope/publish", b'{"event_type": "e", "data": 1}', 404, "topic 'nope' not found"),
        ("POST", "/stream/r1/publish", b'{"data": 1}', 400, "missing field 'event'"),
        ("POST", "/stream/r1/publish", b'{"event": "e"}', 400, "missing field 'data'"),
        ("GET", "/stream/r1/consume/s?from_offset=abc", b"", 400, "from_offset must be an integer"),
        ("GET", "/stream/nope/stats", b"", 404, "room 'nope' not found"),
        ("POST", "/consumer-groups/g-bad", b'{"topic": "missing-topic"}', 404, "not found"),
        (
            "POST",
            "/consumer-groups/g-bad",
            b'{"topic": "t", "partition_count": 2, "strategy": "lifo"}',
            400,
            "unknown strategy",
        ),
        ("GET", "/consumer-groups/nope/offsets/0", b"", 404, "not found"),
    ],
)
async def test_bad_requests_get_the_right_status_and_a_readable_body(
    http, method, path, body, status, fragment
):
    async with http.request(method, path, data=body) as r:
        assert r.status == status
        if fragment:
            answer = await r.json()
            assert fragment in answer["error"]
            assert answer["code"] == status


async def test_oversized_and_negative_offsets_leave_stored_data_alone(
    client: StreamsClient, http: aiohttp.ClientSession
) -> None:
    await client.create_topic("safe", 1)
    await client.publish_to_topic("safe", "e", "kept")
    async with http.post("/topics/safe/publish", json={"event_type": "e", "data": "x" * 10_000}) as r:
        assert r.status == 413
        assert "larger than the limit" in (await r.json())["error"]
    async with http.post("/topics/safe/partitions/0/consume", json={"from_offset": -1}) as r:
        assert r.status == 400
        assert ">= 0" in (await r.json())["error"]
    async with http.post("/topics/safe/partitions/0/consume", json={"from_offset": 5}) as r:
        answer = await r.json()
        assert r.status == 400
        assert answer["type"] == "OffsetOutOfRange"
        assert answer["newest"] == 0
    async with http.post("/topics/safe/partitions/7/consume", json={}) as r:
        assert r.status == 404
    async with http.post("/topics/safe", json={}) as r:
        assert r.status == 409
    page = await client.consume_partition("safe", 0)
    assert [e["data"] for e in page["events"]] == ["kept"]


async def test_openapi_health_ready_and_metrics(client: StreamsClient, http: aiohttp.ClientSession) -> None:
    async with http.get("/openapi.json") as r:
        spec = await r.json()
    assert spec["openapi"].startswith("3.")
    for path in (
        "/api/v1/command",
        "/topics/{topic}/publish",
        "/consumer-groups/{group}/offsets/commit",
        "/stream/{room}/ws/{subscriber_id}",
        "/events/{room}",
    ):
        assert path in spec["paths"]
    async with http.get("/ready") as r:
        assert r.status == 200
    await client.publish("metered", "m", 1)
    async with http.get("/metrics") as r:
        text = await r.text()
    assert "meshplane_streams_events_published_total" in text
    assert "meshplane_group_lag" in text
    assert "meshplane_fsync_seconds_bucket" in text
    await client.create_topic("inspected", 2)
    async with http.get("/storage") as r:
        storage = await r.json()
    assert (r.status, storage["problems"]) == (200, [])
    assert storage["limits"]["partitions"]["used"] >= 2


# --- auth -----------------------------------------------------------------------------------------


async def test_token_auth() -> None:
    with StreamsServerProcess(env={"MESHPLANE_STREAMS_TOKEN": TOKEN}) as proc:
        proc.start()
        assert proc.proc is not None
        assert TOKEN not in str(proc.proc.args)  # the command line, which `ps` shows
        async with aiohttp.ClientSession(proc.url) as session:
            async with session.get("/health") as r:
                assert r.status == 200
            async with session.post("/api/v1/command", json={"command": "stream.list"}) as r:
                assert r.status == 401
                assert await r.read() == b""
            async with session.get("/topics", headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            basic = base64.b64encode(f"user:{TOKEN}".encode()).decode()
            async with session.get("/topics", headers={"Authorization": f"Basic {basic}"}) as r:
                assert r.status == 200
        async with SynapClient(SynapConfig(proc.url, auth_token=TOKEN)) as synap:
            assert await synap.stream.publish("authed", "e", 1) == 0
        assert TOKEN not in proc.log_path.read_text()
        async with StreamsClient(proc.url) as anonymous:
            with pytest.raises(StreamError, match="401"):
                await anonymous.rooms()
        async with aiohttp.ClientSession(proc.url) as session:
            # ?access_token= only where browsers need it (WebSocket, SSE), nowhere else.
            async with session.get("/topics", params={"access_token": TOKEN}) as r:
                assert r.status == 401
            async with session.ws_connect("/api/v1/ws", params={"access_token": TOKEN}) as ws:
                await ws.send_str(json.dumps({"command": "stream.list", "request_id": 1}))
                assert json.loads((await ws.receive(timeout=10)).data)["success"] is True


SCOPED_TOKENS = """
# token                              scopes
admin-0123456789abcdef
orders-writer-0123456789             write:orders. read:orders.
reader-0123456789abcdef              read
"""


async def test_scoped_tokens(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(SCOPED_TOKENS)
    with StreamsServerProcess(extra_args=("--token-file", str(token_file))) as proc:
        proc.start()
        admin = {"Authorization": "Bearer admin-0123456789abcdef"}
        writer = {"Authorization": "Bearer orders-writer-0123456789"}
        reader = {"Authorization": "Bearer reader-0123456789abcdef"}
        event = {"event_type": "e", "data": 1}
        async with aiohttp.ClientSession(proc.url) as http:
            for name in ("orders.eu", "billing"):
                async with http.post(f"/topics/{name}", json={"num_partitions": 1}, headers=writer) as r:
                    assert r.status == 403  # creating is admin
                async with http.post(f"/topics/{name}", json={"num_partitions": 1}, headers=admin) as r:
                    assert r.status in (200, 201)
            async with http.post("/topics/orders.eu/publish", json=event, headers=writer) as r:
                assert r.status == 200
            async with http.post("/topics/billing/publish", json=event, headers=writer) as r:
                assert r.status == 403  # outside its prefix
                assert (await r.json())["type"] == "Forbidden"
            async with http.post("/topics/billing/publish", json=event, headers=reader) as r:
                assert r.status == 403  # read only
            consume = {"from_offset": 0}
            async with http.post("/topics/billing/partitions/0/consume", json=consume, headers=reader) as r:
                assert r.status == 200
            async with http.delete("/topics/orders.eu", headers=writer) as r:
                assert r.status == 403
            # The command endpoint checks each command the same way.
            for headers, command, allowed in (
                (writer, {"command": "topic.publish", "payload": {"topic": "orders.eu", **event}}, True),
                (writer, {"command": "topic.publish", "payload": {"topic": "billing", **event}}, False),
                (reader, {"command": "stream.publish", "payload": {"room": "r", **event}}, False),
                (writer, {"command": "pubsub.subscribe", "payload": {"topics": ["orders.#", "#"]}}, False),
                (writer, {"command": "pubsub.subscribe", "payload": {"topics": ["orders.eu.#"]}}, True),
            ):
                async with http.post("/api/v1/command", json=command, headers=headers) as r:
                    answer = await r.json()
                assert answer["success"] is allowed, (command, answer)
                if not allowed:
                    assert answer["code"] == 403
            # A reader view is its writer's: a read-only token writing another's name writes its own.
            view = "/topics/orders.eu/readers/etl"
            async with http.put(
                view, json={"offsets": {"0": 1}, "identity": "checkpoint"}, headers=writer
            ) as r:
                assert r.status == 200
            async with http.put(view, json={"offsets": {"0": 0}}, headers=reader) as r:
                assert r.status == 200
            async with http.put(
                "/topics/billing/readers/etl", json={"offsets": {"0": 0}}, headers=writer
            ) as r:
                assert r.status == 403  # no read scope on billing
            async with http.get("/topics/orders.eu/readers", headers=admin) as r:
                views = {v["owner"]: v for v in (await r.json())["readers"]}
            assert len(views) == 2
            assert sorted((v["offsets"]["0"], v["identity"]) for v in views.values()) == [
                (0, ""),
                (1, "checkpoint"),
            ]
            assert all(owner.startswith("t") and "0123456789" not in owner for owner in views)  # no token


# --- durability -----------------------------------------------------------------------------------


@pytest.mark.parametrize("channel", [False, True], ids=["rest", "channel"])
async def test_sigkill_loses_no_acknowledged_event(channel: bool) -> None:
    """Publish as fast as acknowledgements come back; SIGKILL mid-stream; all acked events survive.

    Over the command channel, calls in flight when the server dies fail at once (no hang), and the
    same client carries on over a new channel once the server is back.
    """
    with StreamsServerProcess(extra_args=("--segment-bytes", "65536")) as proc:
        proc.start()
        acked: dict[tuple[int, int], Any] = {}
        async with StreamsClient(proc.url, channel=channel) as c:
            await c.create_topic("durable", 2)
            await c.create_group("g", "durable")
            member = await c.join("g", member_id="m1")
            await c.commit("g", 0, 7, member_id="m1", generation=member["generation"])

            async def publisher(n: int) -> None:
                i = 0
                while True:
                    data = {"writer": n, "i": i, "pad": "x" * (i % 97)}
                    try:
                        place = await c.publish_to_topic("durable", "e", data, key=f"k{n}-{i}")
                    except (TimeoutError, aiohttp.ClientError, StreamError):
                        return
                    acked[place] = data
                    i += 1

            writers = [asyncio.create_task(publisher(n)) for n in range(4)]
            await eventually(lambda: len(acked) >= 2_000, timeout=60, what="2000 acknowledged publishes")
            proc.kill(signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*writers), 10)
            with pytest.raises((aiohttp.ClientError, StreamError)):
                await c.publish("after-restart", "e", 1)
            proc.start()
            assert await c.publish("after-restart", "e", 2) == 0
        async with StreamsClient(proc.url) as c:
            found: dict[tuple[int, int], Any] = {}
            for p in (0, 1):
                offset = 0
                while True:
                    page = await c.consume_partition("durable", p, offset, 1000)
                    found.update({(p, e["offset"]): e["data"] for e in page["events"]})
                    if not page["events"]:
                        break
                    offset = page["next_offset"]
            for place, data in acked.items():
                assert found[place] == data
            stats = await c.topic_stats("durable")
            assert [s["max_offset"] + 1 for s in stats["partitions"]] == [
                max(o for (p, o) in found if p == q) + 1 for q in (0, 1)
            ]  # contiguous, no holes
            assert sorted(found) == sorted(
                (p, o) for p in (0, 1) for o in range(stats["partitions"][p]["next_offset"])
            )
            # Metadata came back too: the group, its member, its generation and its offset.
            group = await c.group_stats("g")
            assert (group["members"], group["generation"]) == (["m1"], member["generation"])
            assert await c.committed("g", 0) == 7
            place = await c.publish_to_topic("durable", "e", "after", partition=0)
            assert place == (0, stats["partitions"][0]["next_offset"])


async def test_retention_deletes_and_reports_out_of_range() -> None:
    with StreamsServerProcess() as proc:
        proc.start()
        async with StreamsClient(proc.url) as c:
            await c.create_topic(
                "short", 1, retention_policy={"type": "Messages", "max_messages": 100}, segment_bytes=2048
            )
            for start in range(0, 300, 10):  # a batch goes into one segment, as in Kafka
                await c.publish_batch(
                    "short", [{"event_type": "e", "data": i} for i in range(start, start + 10)]
                )
            stats = (await c.topic_stats("short"))["partitions"][0]
            assert (stats["min_offset"], stats["max_offset"], stats["message_count"]) == (200, 299, 100)
            await eventually(lambda: _segments_fewer(proc), timeout=10, what="old segments deleted")
            with pytest.raises(OffsetOutOfRange) as info:
                await c.consume_partition("short", 0, 150)
            assert (info.value.oldest, info.value.newest) == (200, 299)
            page = await c.consume_partition("short", 0, 200, 1000)
            assert [e["data"] for e in page["events"]] == list(range(200, 300))


def _segments_fewer(proc: StreamsServerProcess) -> bool:
    logs = sorted((proc.data_dir / "topics" / "short" / "0").glob("*.log"))
    return bool(logs) and int(logs[0].stem) > 0 and int(logs[0].stem) <= 200


async def test_rooms_survive_a_crash_and_offsets_continue() -> None:
    with StreamsServerProcess(extra_args=("--room-max-events", "20")) as proc:
        proc.start()
        async with StreamsClient(proc.url) as c:
            await c.create_room("persist", max_events=20)
            for i in range(30):
                await c.publish("persist", "tick", {"i": i})
        proc.kill(signal.SIGKILL)
        proc.start()
        async with StreamsClient(proc.url) as c:
            history = await c.history("persist", limit=100)
            assert [e["data"]["i"] for e in history["events"]] == list(range(10, 30))
            assert (history["oldest_offset"], history["newest_offset"]) == (10, 29)
            assert await c.publish("persist", "tick", {"i": 30}) == 30


async def test_growing_a_topic_rebalances_its_groups(client: StreamsClient) -> None:
    await client.create_topic("grow", 2)
    await client.create_group("growers", "grow", strategy="range")
    member = await client.join("growers", member_id="solo")
    assert member["partitions"] == [0, 1]
    assert (await client.add_partitions("grow", 4))["num_partitions"] == 4
    beat = await client.heartbeat("growers", "solo")
    assert (beat["generation"], beat["partitions"]) == (member["generation"] + 1, [0, 1, 2, 3])
    assert len((await client.topic_stats("grow"))["partitions"]) == 4
    with pytest.raises(StreamError, match="ask for more"):
        await client.add_partitions("grow", 3)


# --- TLS ------------------------------------------------------------------------------------------


async def test_tls_serves_https_and_refuses_plain_http(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    args = ("--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"))
    with StreamsServerProcess(extra_args=args, env={"MESHPLANE_STREAMS_TOKEN": TOKEN}) as proc:
        proc.start()
        assert proc.url.startswith("https://")
        client_tls = ssl.create_default_context()
        ca.configure_trust(client_tls)
        async with StreamsClient(proc.url, token=TOKEN, tls=client_tls) as client:
            await client.create_topic("secure", 1)
            partition, offset = await client.publish_to_topic("secure", "e", {"n": 1})
            assert (partition, offset) == (0, 0)
        async with StreamsClient(proc.url, token=TOKEN) as untrusting:  # the system's CAs: refused
            with pytest.raises(aiohttp.ClientConnectorCertificateError, match="certificate verify failed"):
                await untrusting.topics()
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientError):
                await plain.get(proc.url.replace("https://", "http://") + "/health")


async def test_offsets_for_a_time(http: aiohttp.ClientSession) -> None:
    assert (await http.post("/topics/timed", json={"num_partitions": 2})).status in (200, 201)
    before = time.time_ns() // 1_000_000 - 1
    await http.post("/topics/timed/publish", json={"event_type": "e", "data": 1, "partition": 1})
    found = await (await http.get("/topics/timed/offsets", params={"timestamp_ms": before})).json()
    assert found["offsets"] == {"0": 0, "1": 0}
    later = await (
        await http.get("/topics/timed/offsets", params={"timestamp_ms": before + 3_600_000})
    ).json()
    assert later["offsets"] == {"0": 0, "1": 1}  # nothing that late: each partition's end
    for bad in ({"timestamp_ms": "soon"}, {"timestamp_ms": "-1"}, {}):
        answer = await http.get("/topics/timed/offsets", params=bad)
        assert answer.status == 400, bad
    assert (await http.get("/topics/nope/offsets", params={"timestamp_ms": 0})).status == 404


async def test_meshplane_metadata_keys_are_the_servers_a_producer_writing_one_gets_a_400_naming_it(
    http: aiohttp.ClientSession,
) -> None:
    poison = {"event_type": "e", "data": "abc", "metadata": {"tenant": "A", "meshplane.encoding": "base64"}}
    async with http.post("/topics/reserved/publish", json=poison) as r:
        assert r.status == 404 or r.status == 400
    async with http.post("/topics/reserved", json={"num_partitions": 1}) as r:
        assert r.status in (200, 201)
    async with http.post("/topics/reserved/publish", json=poison) as r:
        assert r.status == 400
        assert "'meshplane.encoding' is reserved" in (await r.json())["error"]
    batch = {"events": [{"event_type": "e", "data": "x", "metadata": {"meshplane.headers": "[" * 100_000}}]}
    async with http.post("/topics/reserved/publish", json=batch) as r:
        assert r.status == 400
        assert "'meshplane.headers' is reserved" in (await r.json())["error"]
    room = {
        "command": "stream.publish",
        "payload": {"room": "r", "event": "e", "data": 1, "metadata": poison["metadata"]},
    }
    async with http.ws_connect("/api/v1/ws") as ws:
        await ws.send_json({**room, "request_id": 1})
        answer = await ws.receive_json(timeout=10)
    assert (answer["success"], answer["code"]) == (False, 400)
    assert "'meshplane.encoding' is reserved" in answer["error"]
    # What the server writes itself, asked for by the event's own fields, is checked first.
    async with http.post(
        "/topics/reserved/publish", json={"event_type": "e", "data": "abc", "encoding": "base64"}
    ) as r:
        assert r.status == 400  # "abc" is not base64: refused, not stored to fail its readers
    good = {"event_type": "e", "data": "AAE=", "encoding": "base64", "headers": [["h", None], ["h", "AQ=="]]}
    async with http.post("/topics/reserved/publish", json=good) as r:
        assert r.status == 200
    async with http.post("/topics/reserved/partitions/0/consume", json={"from_offset": 0}) as r:
        (event,) = (await r.json())["events"]
    assert event["metadata"] == {
        "meshplane.encoding": "base64",
        "meshplane.headers": '[["h",null],["h","AQ=="]]',
    }
