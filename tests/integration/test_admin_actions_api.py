"""The admin actions the dashboard offers, over HTTP on real ``meshplane serve`` processes: changing
a topic's and a room's retention, pausing and resuming a mesh queue. Bad bodies are 4xx and change
nothing; only admin tokens may act; what is changed survives a restart."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import requests

from meshplane.launchers import MeshCluster, NatsServer, StreamsServerProcess
from meshplane.streams.jetstream import naming
from tests.helpers import wait_until
from tests.support.servers import start_together

ADMIN = "admin-actions-token-0123456"
READER = "reader-actions-token-0123456"
WRITER = "writer-actions-token-0123456"


def call(method: str, url: str, body: Any = None, token: str = ADMIN, **kw: Any) -> requests.Response:
    return requests.request(
        method, url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=5, **kw
    )


def ok(response: requests.Response) -> dict[str, Any]:
    assert response.status_code < 300, response.text
    answer: dict[str, Any] = response.json()
    return answer


def tokens_file(folder: Path) -> tuple[str, ...]:
    path = folder / "tokens"
    path.write_text(f"{ADMIN} admin\n{WRITER} write\n{READER} read\n")
    return ("--token-file", str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamsServerProcess]:
    args = tokens_file(tmp_path_factory.mktemp("tokens"))
    with StreamsServerProcess(extra_args=(*args, "--segment-bytes", "1024")) as proc:
        proc.start()
        yield proc


def publish(url: str, topic: str, n: int) -> None:
    events = [{"event_type": "e", "data": {"pad": "x" * 100, "i": i}} for i in range(n)]
    ok(call("POST", f"{url}/topics/{topic}/publish", {"events": events, "partition": 0}))


def stats(url: str, topic: str) -> dict[str, Any]:
    return ok(call("GET", f"{url}/topics/{topic}/stats"))


def test_a_shorter_topic_retention_deletes_old_segments_and_survives_a_restart(
    server: StreamsServerProcess,
) -> None:
    url = server.url
    ok(call("POST", f"{url}/topics/shrunk", {"num_partitions": 1}))
    publish(url, "shrunk", 200)
    assert stats(url, "shrunk")["partitions"][0]["min_offset"] == 0
    answer = ok(
        call(
            "PUT",
            f"{url}/topics/shrunk/retention",
            {"retention_policy": {"type": "Messages", "max_messages": 20}},
        )
    )
    assert answer["retention_policy"] == {"type": "Messages", "max_messages": 20}
    # whole segments go at the next retention pass: at most a segment's worth above the limit stays
    wait_until(
        lambda: stats(url, "shrunk")["partitions"][0]["min_offset"] >= 150, what="old segments deleted"
    )
    server.stop()
    server.start()
    url = server.url
    assert stats(url, "shrunk")["retention_policy"] == {"type": "Messages", "max_messages": 20}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({}, 400),
        ({"retention_policy": "forever"}, 400),
        ({"retention_policy": {"type": "Weekly"}}, 400),
        ({"retention_policy": {"type": "Time"}}, 400),
        ({"retention_policy": {"type": "Time", "retention_secs": -5}}, 400),
        ({"retention_policy": {"type": "Size", "max_bytes": "1 GB"}}, 400),
        ([1, 2], 400),
    ],
)
def test_a_bad_retention_body_is_a_400_and_changes_nothing(
    server: StreamsServerProcess, body: Any, status: int
) -> None:
    url = server.url
    call("POST", f"{url}/topics/kept-retention", {"num_partitions": 1})
    before = stats(url, "kept-retention")["retention_policy"]
    response = call("PUT", f"{url}/topics/kept-retention/retention", body)
    assert response.status_code == status, response.text
    assert "error" in response.json()
    assert stats(url, "kept-retention")["retention_policy"] == before


def test_retention_of_a_missing_topic_or_room_is_a_404_and_non_json_a_400(
    server: StreamsServerProcess,
) -> None:
    url = server.url
    infinite = {"retention_policy": {"type": "Infinite"}}
    assert call("PUT", f"{url}/topics/nowhere/retention", infinite).status_code == 404
    assert call("PUT", f"{url}/stream/nowhere/retention", {"max_events": 5}).status_code == 404
    response = requests.put(
        f"{url}/topics/nowhere/retention",
        data=b"{not json",
        headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
        timeout=5,
    )
    assert response.status_code == 400


def test_only_an_admin_token_changes_retention(server: StreamsServerProcess) -> None:
    url = server.url
    call("POST", f"{url}/topics/guarded-retention", {"num_partitions": 1})
    ok(call("POST", f"{url}/stream/guarded-room", {"max_events": 10}))
    body: dict[str, Any] = {"retention_policy": {"type": "Time", "retention_secs": 60}}
    shorter: dict[str, Any] = {"max_events": 2}
    for path, payload in (("/topics/guarded-retention", body), ("/stream/guarded-room", shorter)):
        assert requests.put(f"{url}{path}/retention", json=payload, timeout=5).status_code == 401
        for token in (READER, WRITER):
            assert call("PUT", f"{url}{path}/retention", payload, token=token).status_code == 403
    assert stats(url, "guarded-retention")["retention_policy"] == {"type": "Infinite"}
    assert ok(call("GET", f"{url}/stream/guarded-room/stats"))["max_events"] == 10


def test_a_rooms_limits_change_at_once_and_survive_a_restart(server: StreamsServerProcess) -> None:
    url = server.url
    ok(call("POST", f"{url}/stream/trimmed", {"max_events": 100, "retention_secs": 3600}))
    for i in range(10):
        ok(call("POST", f"{url}/stream/trimmed/publish", {"event": "e", "data": {"i": i}}))
    for bad in (
        {},
        {"max_events": 0},
        {"max_events": "three"},
        {"retention_secs": "soon"},
        {"retention_secs": -1},
    ):
        assert call("PUT", f"{url}/stream/trimmed/retention", bad).status_code == 400, bad
    answer = ok(call("PUT", f"{url}/stream/trimmed/retention", {"max_events": 3}))
    assert (answer["max_events"], answer["retention_secs"]) == (3, 3600)  # what is left out stays
    room = ok(call("GET", f"{url}/stream/trimmed/stats"))
    assert (room["message_count"], room["min_offset"]) == (3, 7)
    answer = ok(call("PUT", f"{url}/stream/trimmed/retention", {"retention_secs": None}))
    assert (answer["max_events"], answer["retention_secs"]) == (3, None)
    server.stop()
    server.start()
    room = ok(call("GET", f"{server.url}/stream/trimmed/stats"))
    assert (room["max_events"], room["retention_secs"], room["min_offset"]) == (3, None, 7)


# --- pausing a queue ----------------------------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StreamsServerProcess]:
    with MeshCluster(1, cluster="paused", extra_args=tokens_file(tmp_path)) as mesh:
        mesh.start()
        yield mesh["a"]


def guaranteed(url: str, n: int) -> None:
    for i in range(n):
        ok(call("POST", f"{url}/pubsub/orders.new/publish", {"payload": {"i": i}, "guaranteed": True}))


def consumed(url: str) -> list[Any]:
    read = ok(call("POST", f"{url}/topics/orders/partitions/0/consume", {"from_offset": 0, "limit": 100}))
    return [event["data"]["i"] for event in read["events"]]


def queue(url: str) -> dict[str, Any]:
    (found,) = ok(call("GET", f"{url}/mesh/queues"))["queues"]
    assert isinstance(found, dict)
    return found


def test_a_paused_queue_stores_but_delivers_nothing_until_resumed_across_a_restart(
    node: StreamsServerProcess,
) -> None:
    url = node.url
    ok(call("PUT", f"{url}/mesh/queues/orders", {"patterns": ["orders.>"]}))
    guaranteed(url, 3)
    assert consumed(url) == [0, 1, 2]
    assert ok(call("POST", f"{url}/mesh/queues/orders/pause"))["paused"] is True
    guaranteed(url, 2)  # still acknowledged: stored
    assert stats(url, "orders")["partitions"][0]["next_offset"] == 5
    assert consumed(url) == []
    records = call("GET", f"{url}/topics/orders/partitions/0/records", params={"from_offset": 0})
    assert (records.status_code, records.content) == (200, b"")
    assert queue(url)["paused"] is True
    node.stop()
    node.start()
    url = node.url
    assert queue(url)["paused"] is True
    assert consumed(url) == []
    guaranteed(url, 1)
    assert ok(call("POST", f"{url}/mesh/queues/orders/resume"))["paused"] is False
    assert consumed(url) == [0, 1, 2, 0, 1, 0]
    node.stop()
    node.start()
    assert queue(node.url)["paused"] is False


def test_pausing_is_for_admins_and_known_queues_only(node: StreamsServerProcess) -> None:
    url = node.url
    ok(call("PUT", f"{url}/mesh/queues/orders", {"patterns": ["orders.>"]}))
    assert call("POST", f"{url}/mesh/queues/nowhere/pause").status_code == 404
    assert requests.post(f"{url}/mesh/queues/orders/pause", timeout=5).status_code == 401
    for token in (READER, WRITER):
        assert call("POST", f"{url}/mesh/queues/orders/pause", token=token).status_code == 403
        assert call("DELETE", f"{url}/mesh/nodes/b", token=token).status_code == 403
    assert queue(url)["paused"] is False
    assert call("DELETE", f"{url}/mesh/nodes/nobody").status_code == 404


def test_a_queue_made_again_after_its_delete_delivers(node: StreamsServerProcess) -> None:
    url = node.url
    ok(call("PUT", f"{url}/mesh/queues/orders", {"patterns": ["orders.>"]}))
    guaranteed(url, 1)
    ok(call("POST", f"{url}/mesh/queues/orders/pause"))
    ok(call("DELETE", f"{url}/mesh/queues/orders"))
    assert consumed(url) == [0]  # its topic stays, readable
    ok(call("PUT", f"{url}/mesh/queues/orders", {"patterns": ["orders.>"]}))
    assert queue(url)["paused"] is False


# --- on JetStream ------------------------------------------------------------------------------------


def test_on_jetstream_each_partitions_stream_takes_the_new_retention_and_other_servers_see_it() -> None:
    with NatsServer(jetstream=True) as jetstream:
        jetstream.start()
        args = ("--storage", jetstream.url)
        with StreamsServerProcess(extra_args=args) as a, StreamsServerProcess(extra_args=args) as b:
            start_together(a, b)
            ok(call("POST", f"{a.url}/topics/shared", {"num_partitions": 2}))
            policy = {"type": "Messages", "max_messages": 3}
            assert ok(call("PUT", f"{a.url}/topics/shared/retention", {"retention_policy": policy}))
            wait_until(lambda: stats(b.url, "shared")["retention_policy"] == policy, what="b sees it")

            async def limits() -> list[int]:
                nc = await nats.connect(jetstream.url)
                try:
                    streams = [naming.partition_stream("shared", p) for p in (0, 1)]
                    return [(await nc.jetstream().stream_info(s)).config.max_msgs or 0 for s in streams]
                finally:
                    await nc.close()

            assert asyncio.run(limits()) == [3, 3]
            ok(call("POST", f"{a.url}/stream/chat/publish", {"event": "e", "data": 1}))
            refused = call("PUT", f"{a.url}/stream/chat/retention", {"max_events": 5})
            assert refused.status_code == 400
            assert "not supported by this storage backend" in refused.json()["error"]
