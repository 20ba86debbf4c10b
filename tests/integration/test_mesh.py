"""The event mesh, part 1, on real nodes: each ``meshplane serve --node-id`` its own process and data
directory, linked over loopback; clients are mesh clients (the event plane's transport), pub/sub
WebSockets and raw sockets where a test plays a misbehaving peer or a slow subscriber."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshplane import EventPlane, PlaneConfig, Scope
from meshplane.core.mesh.frames import (
    PROTOCOL_VERSION,
    FrameType,
    encode_event,
    encode_frame,
    event_parts,
)
from meshplane.errors import TransportAuthError
from meshplane.launchers import MeshCluster, StreamsServerProcess
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.mesh_peers import RawPeer
from tests.support.mesh import Inbox, interest_reached, link, status


async def all_linked(cluster: MeshCluster) -> None:
    await asyncio.to_thread(cluster.wait_linked)


@pytest.fixture(scope="module")
def three() -> Iterator[MeshCluster]:
    with MeshCluster(3) as cluster:
        yield cluster.start()


async def test_a_subscriber_on_c_gets_exactly_what_a_publishes_for_its_subjects(three: MeshCluster) -> None:
    await all_linked(three)
    a = await MeshClient(three["a"].route_url).connect()
    c = await MeshClient(three["c"].route_url).connect()
    try:
        exact, wild = Inbox(), Inbox()
        c.subscribe("t1.orders.eu", exact)
        c.subscribe("t1.orders.>", wild)
        await c.flush()
        await interest_reached(three["a"], "c", "t1.orders.>")
        before_b = (await link(three["a"], "b"))["events_out"]
        before_c = (await link(three["a"], "c"))["events_out"]
        for i in range(50):
            await a.publish("t1.orders.eu", b"eu%d" % i)
            await a.publish("t1.orders.us.west", b"us%d" % i)
            await a.publish("t1.payments.eu", b"no%d" % i)
        await a.flush()
        await eventually(lambda: len(wild.events) == 100 and len(exact.events) == 50)
        assert exact.events == [("t1.orders.eu", b"eu%d" % i) for i in range(50)]
        assert sorted(wild.events) == sorted(
            [("t1.orders.eu", b"eu%d" % i) for i in range(50)]
            + [("t1.orders.us.west", b"us%d" % i) for i in range(50)]
        )
        a_to_c = await link(three["a"], "c")
        assert a_to_c["events_out"] - before_c == 100  # one copy each, although two subscriptions match eu
        assert (await link(three["a"], "b"))["events_out"] == before_b  # no interest at b: nothing sent
    finally:
        await a.close()
        await c.close()


async def test_a_hundred_subscribers_behind_one_link_cost_one_copy_per_event(three: MeshCluster) -> None:
    await all_linked(three)
    subscribers = [await MeshClient(three["c"].route_url).connect() for _ in range(100)]
    publisher = await MeshClient(three["a"].route_url).connect()
    try:
        inboxes = [Inbox() for _ in subscribers]
        for client, inbox in zip(subscribers, inboxes, strict=True):
            client.subscribe("t2.fanout", inbox)
        for client in subscribers:
            await client.flush()
        await interest_reached(three["a"], "c", "t2.fanout")
        sent_before = (await link(three["a"], "c"))["events_out"]
        received_before = (await link(three["c"], "a"))["events_in"]
        for i in range(200):
            await publisher.publish("t2.fanout", b"%d" % i)
        await publisher.flush()
        await eventually(lambda: all(len(inbox.events) == 200 for inbox in inboxes), timeout=20)
        assert all([body for _, body in inbox.events] == [b"%d" % i for i in range(200)] for inbox in inboxes)
        assert (await link(three["a"], "c"))["events_out"] - sent_before == 200
        assert (await link(three["c"], "a"))["events_in"] - received_before == 200
        assert (await status(three["a"]))["interest"]["subscriptions_remote"] >= 1
    finally:
        for client in [*subscribers, publisher]:
            await client.close()


@pytest.mark.parametrize("attempt", range(3))
async def test_links_dialled_from_both_ends_switch_connections_without_losing_an_event(attempt: int) -> None:
    """Both nodes dial each other as they start; the pair moves to one connection while events flow.
    Before the link is up events are dropped (and counted); from the first delivered on, none is."""
    with MeshCluster(2) as cluster:
        for node in cluster.nodes:  # one after the other: a dials b before b is up, then b dials a
            node.start()
        a = await MeshClient(cluster["a"].route_url).connect()
        b = await MeshClient(cluster["b"].route_url).connect()
        try:
            inbox = Inbox()
            a.subscribe("switch.x", inbox)
            await a.flush()
            sent, switched_at, deadline = 0, 0, time.monotonic() + 30
            # Until the pair has switched connections (a's retry comes after b's first dial), then more.
            while not switched_at or sent < switched_at + 500:
                await b.publish("switch.x", b"%d" % sent)
                sent += 1
                if sent % 20 == 0:
                    await b.flush()
                    await asyncio.sleep(0.002)
                if not switched_at and sent % 100 == 0:
                    links = (await status(cluster["a"]))["links"]
                    if links and links[0]["connects"] >= 2:
                        switched_at = sent
                    assert time.monotonic() < deadline, f"no switch of connections in 30 s: {links}"
            await b.flush()
            await eventually(lambda: inbox.events[-1:] == [("switch.x", b"%d" % (sent - 1))])
            numbers = [int(body) for _, body in inbox.events]
            assert numbers == list(range(numbers[0], sent))
        finally:
            await a.close()
            await b.close()


async def test_three_local_subscribers_are_one_sub_add_and_the_last_one_out_one_sub_remove(
    three: MeshCluster,
) -> None:
    await all_linked(three)
    before = await link(three["b"], "a")
    clients = [await MeshClient(three["a"].route_url).connect() for _ in range(3)]
    try:
        sids = [client.subscribe("t3.payments", Inbox()) for client in clients]
        for client in clients:
            await client.flush()
        await interest_reached(three["b"], "a", "t3.payments")
        for client, sid in list(zip(clients, sids, strict=True))[:2]:
            client.unsubscribe(sid)
            # until b and c have handled all a sent before: a wrong SUB_REMOVE would have arrived
            await client.flush(propagated=True)
        await interest_reached(three["c"], "a", "t3.payments")  # still there
        after_two = await link(three["b"], "a")
        assert after_two["sub_add_in"] - before["sub_add_in"] == 1
        assert after_two["sub_remove_in"] - before["sub_remove_in"] == 0
        clients[2].unsubscribe(sids[2])
        await clients[2].flush()
        await interest_reached(three["b"], "a", "t3.payments", present=False)
        assert (await link(three["b"], "a"))["sub_remove_in"] - before["sub_remove_in"] == 1
    finally:
        for client in clients:
            await client.close()


async def test_pubsub_messages_cross_the_mesh_to_websocket_listeners(three: MeshCluster) -> None:
    await all_linked(three)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{three['c'].url}/pubsub/ws?topics=t4.alerts.*") as ws,
    ):
        assert json.loads((await ws.receive()).data)["type"] == "connected"
        await interest_reached(three["a"], "c", "t4.alerts.*")
        async with http.post(
            f"{three['a'].url}/pubsub/t4.alerts.cpu/publish", json={"payload": {"load": 0.9}}
        ) as response:
            assert response.status == 200
        message = json.loads((await ws.receive(timeout=10)).data)
        assert message["topic"] == "t4.alerts.cpu"
        assert message["payload"] == {"load": 0.9}
        # An event-plane (opaque) event reaches pub/sub listeners too: JSON bodies as JSON.
        publisher = await MeshClient(three["b"].route_url).connect()
        await publisher.publish("t4.alerts.disk", b'{"free": 1}')
        await publisher.flush()
        message = json.loads((await ws.receive(timeout=10)).data)
        await publisher.close()
        assert message["payload"] == {"free": 1}
        assert message["metadata"]["encoding"] == "json"


async def test_subscribe_and_unsubscribe_churn_converges_to_the_exact_interest(three: MeshCluster) -> None:
    await all_linked(three)
    rng = random.Random(7)
    pool = [f"t5.p{i}.{tail}" for i in range(100) for tail in ("x", "*", ">")]
    clients = {
        node: [await MeshClient(three[node].route_url).connect() for _ in range(3)] for node in three.ids
    }
    held: dict[tuple[str, int], dict[str, int]] = {(n, i): {} for n in three.ids for i in range(3)}
    try:
        for _ in range(10_000):
            node, index = rng.choice(three.ids), rng.randrange(3)
            mine = held[node, index]
            if mine and rng.random() < 0.5:
                pattern = rng.choice(sorted(mine))
                clients[node][index].unsubscribe(mine.pop(pattern))
            else:
                pattern = rng.choice(pool)
                if pattern not in mine:
                    mine[pattern] = clients[node][index].subscribe(pattern, Inbox())
        for node in three.ids:
            for client in clients[node]:
                await client.flush()
        expected = {node: sorted({p for i in range(3) for p in held[node, i]}) for node in three.ids}

        async def converged() -> bool:
            for node in three.ids:
                answer = (await status(three[node], patterns=True))["patterns"]
                if answer["local"] != expected[node]:
                    return False
                if any(answer["peers"].get(peer) != expected[peer] for peer in three.ids if peer != node):
                    return False
            return True

        await eventually(converged, timeout=20, interval=0.05, what="every node holds the exact interest")
    finally:
        for group in clients.values():
            for client in group:
                await client.close()


async def test_four_nodes_publishing_and_subscribing_everywhere_deliver_each_event_exactly_once() -> None:
    with MeshCluster(4).start() as cluster:
        await all_linked(cluster)
        clients = {node: await MeshClient(cluster[node].route_url).connect() for node in cluster.ids}
        try:
            everything = {node: Inbox() for node in cluster.ids}
            only_a = Inbox()
            for node, client in clients.items():
                client.subscribe("four.>", everything[node])
            clients["d"].subscribe("four.a", only_a)
            for client in clients.values():
                await client.flush()
            for node in cluster.ids:
                for peer in cluster.ids:
                    if peer != node:
                        await interest_reached(cluster[node], peer, "four.>")
            for node, client in clients.items():
                for i in range(100):
                    await client.publish(f"four.{node}", b"%s-%d" % (node.encode(), i))
            for client in clients.values():
                await client.flush()
            expected = sorted(
                ("four." + n, b"%s-%d" % (n.encode(), i)) for n in cluster.ids for i in range(100)
            )
            await eventually(
                lambda: all(len(inbox.events) >= 400 for inbox in everything.values()), timeout=20
            )
            await eventually(lambda: len(only_a.events) >= 100)
            for inbox in everything.values():
                assert sorted(inbox.events) == expected  # each once: no loops, no duplicates
            assert only_a.events == [("four.a", b"a-%d" % i) for i in range(100)]
            for node in cluster.ids:
                links = (await status(cluster[node]))["links"]
                assert sum(x["events_out"] for x in links) == 300  # its own 100, once to each of 3 peers
                assert sum(x["events_in"] for x in links) == 300  # the others' 300, never forwarded on
        finally:
            for client in clients.values():
                await client.close()


async def test_event_plane_envelopes_cross_the_mesh_with_no_gap_from_the_first_event(
    three: MeshCluster, tmp_path: Path
) -> None:
    """A subscriber through node c, a publisher through node a: the subscription is known cluster-wide
    once the subscriber exists (its start waits for every peer), so even the first event arrives."""
    scope = Scope.endpoint("mesh-e2e", "worker", "generate")
    base = PlaneConfig(event_plane="mesh", discovery_backend="file", file_kv=tmp_path / "kv")
    await all_linked(three)
    async with (
        EventPlane(base.replace(mesh_node=three["c"].route_url)) as far,
        EventPlane(base.replace(mesh_node=three["a"].route_url)) as near,
    ):
        subscriber = await far.subscriber(scope, "kv-events")
        publisher = await near.publisher(scope, "kv-events")
        for i in range(100):
            await publisher.publish({"i": i})
        events = [await subscriber.next(timeout=10) for _ in range(100)]
        assert [e.sequence for e in events] == list(range(100))
        assert [e.decode() for e in events] == [{"i": i} for i in range(100)]
        assert subscriber.stats.gaps == 0
        assert {e.publisher_id for e in events} == {publisher.publisher_id}


async def test_a_node_with_a_secret_refuses_clients_without_it() -> None:
    args = ("--node-id", "locked", "--route-port", "0")
    with StreamsServerProcess(extra_args=args, env={"MESHPLANE_MESH_SECRET": "s3cret"}) as node:
        node.start()
        with pytest.raises(TransportAuthError, match="secret"):
            await MeshClient(node.route_url, secret="wrong", timeout=3).connect()
        client = await MeshClient(node.route_url, secret="s3cret").connect()
        await client.flush()
        await client.close()
        assert "s3cret" not in node.log_path.read_text()
        assert (await status(node))["frame_errors"]["hello_auth"] == 1


async def test_bad_frames_and_unwanted_events_are_counted_and_the_link_stays_up(three: MeshCluster) -> None:
    await all_linked(three)
    c = await MeshClient(three["c"].route_url).connect()
    inbox = Inbox()
    c.subscribe("t6.wanted", inbox)
    await c.flush()
    peer = await asyncio.to_thread(RawPeer(three["c"].route_url, "intruder").authenticate)
    sock = peer.sock
    try:
        await asyncio.to_thread(peer.read_until, FrameType.SYNC_REQ)
        corrupt = bytearray(encode_event("intruder", "t6.wanted", 1, 1, b"corrupt"))
        corrupt[-6] ^= 0xFF
        junk_type = bytearray(encode_frame(FrameType.HEARTBEAT, "intruder"))
        junk_type[0] = 42
        junk_type[-4:] = zlib.crc32(junk_type[:-4]).to_bytes(4, "big")
        peer.send(  # in the session's records: frames bad inside a good record
            bytes(corrupt)
            + bytes(junk_type)
            + encode_event("intruder", "t6.unwanted", 2, 1, b"nobody")
            + encode_event("intruder", "t6.bad..subject", 3, 1, b"x")
            + encode_event("intruder", "t6.wanted", 4, 1, b"ok")
            + encode_event("intruder", "t6.wanted", 4, 1, b"ok")  # a retransmission: same event id
        )
        await eventually(lambda: inbox.events == [("t6.wanted", b"ok")])
        entry = await link(three["c"], "intruder")
        assert entry["state"] == "syncing"  # never answered the node's SYNC_REQ, but still connected
        assert entry["bad_frames"] == 3  # the checksum, the unknown type, the invalid subject
        assert entry["unwanted_in"] == 1
        assert entry["duplicates_in"] == 1
        errors = (await status(three["c"]))["frame_errors"]
        assert errors["checksum"] >= 1
        assert errors["unknown_type"] >= 1
        assert errors["bad_subject"] >= 1
    finally:
        sock.close()
        await c.close()


async def test_a_node_of_another_cluster_or_protocol_is_refused() -> None:
    with StreamsServerProcess(
        extra_args=("--node-id", "solo", "--cluster", "c1", "--route-port", "0")
    ) as node:
        node.start()
        for cluster, protocol, reason in (
            ("c2", PROTOCOL_VERSION, "hello_cluster"),
            ("c1", 1, "hello_version"),
        ):
            peer = RawPeer(node.route_url, "other", cluster)
            answer = await asyncio.to_thread(peer.hello, protocol)
            peer.close()
            assert ("cluster" if protocol == PROTOCOL_VERSION else "protocol 1") in answer.error
            assert (await status(node))["frame_errors"][reason] == 1
        assert (await status(node))["links"] == []


async def test_anti_entropy_repairs_interest_whose_sub_adds_were_lost() -> None:
    faulty = ("--mesh-fault", "drop_sub_add")
    with MeshCluster(3, node_args={"a": faulty}).start() as cluster:
        await all_linked(cluster)
        a = await MeshClient(cluster["a"].route_url).connect()
        b = await MeshClient(cluster["b"].route_url).connect()
        try:
            inbox = Inbox()
            a.subscribe("ae.>", inbox)  # its SUB_ADD is never sent: only digests can tell the peers
            await a.flush()
            await interest_reached(cluster["b"], "a", "ae.>")
            await interest_reached(cluster["c"], "a", "ae.>")
            await b.publish("ae.x", b"repaired")
            await b.flush()
            await eventually(lambda: inbox.events == [("ae.x", b"repaired")])
            b_to_a = await link(cluster["b"], "a")
            # A digest that differed asked for the buckets: on a heartbeat (a resync), or on the
            # check that follows a connection switch when both ends dialled at once.
            assert b_to_a["resyncs"] + b_to_a["connection_swaps"] >= 1
            assert b_to_a["sub_add_in"] == 0
        finally:
            await a.close()
            await b.close()


async def test_a_killed_node_comes_back_resyncs_and_what_it_missed_is_counted() -> None:
    with MeshCluster(3).start() as cluster:
        await all_linked(cluster)
        a = await MeshClient(cluster["a"].route_url).connect()
        c = await MeshClient(cluster["c"].route_url, timeout=30).connect()
        try:
            inbox = Inbox()
            c.subscribe("kill.>", inbox)
            await c.flush()
            await interest_reached(cluster["a"], "c", "kill.>")
            await a.publish("kill.before", b"1")
            await a.flush()
            await eventually(lambda: len(inbox.events) == 1)
            cluster["c"].kill(signal.SIGKILL)
            await eventually(
                lambda: _state(cluster["a"], "c", "down"), timeout=10, interval=0.05, what="a sees c down"
            )
            for i in range(10):
                await a.publish("kill.while_down", b"%d" % i)
            await a.flush()
            assert (await link(cluster["a"], "c"))["dropped_peer_down"] == 10
            cluster["c"].start()  # same port, same data directory
            await all_linked(cluster)
            await interest_reached(cluster["a"], "c", "kill.>")  # c's client came back and resubscribed
            await a.publish("kill.after", b"2")
            await a.flush()
            await eventually(lambda: inbox.events[-1:] == [("kill.after", b"2")], timeout=15)
            assert [s for s, _ in inbox.events] == ["kill.before", "kill.after"]
            assert (await link(cluster["a"], "c"))["connects"] >= 2
        finally:
            await a.close()
            await c.close()


async def _state(node: StreamsServerProcess, peer: str, state: str) -> bool:
    return bool((await link(node, peer))["state"] == state)


async def test_a_tiny_bloom_filter_gives_false_positives_never_wrong_deliveries() -> None:
    tiny = ("--bloom-filter-capacity", "1", "--bloom-filter-fpr", "0.9")
    with MeshCluster(2, extra_args=tiny).start() as cluster:
        await all_linked(cluster)
        a = await MeshClient(cluster["a"].route_url).connect()
        b = await MeshClient(cluster["b"].route_url).connect()
        try:
            inbox = Inbox()
            b.subscribe("bloom.wanted", inbox)
            await b.flush()
            await interest_reached(cluster["a"], "b", "bloom.wanted")
            for i in range(300):
                await a.publish(f"bloom.other{i}", b"no")
            await a.publish("bloom.wanted", b"yes")
            await a.flush()
            await eventually(lambda: inbox.events == [("bloom.wanted", b"yes")])
            a_to_b = await link(cluster["a"], "b")
            assert a_to_b["bloom_false_positives"] > 0
            assert a_to_b["events_out"] == 1  # the exact table behind the filter: no wasted send
            assert (await link(cluster["b"], "a"))["unwanted_in"] == 0
        finally:
            await a.close()
            await b.close()


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest", "disconnect"])
async def test_backpressure_policies_on_a_subscriber_that_stops_reading(policy: str) -> None:
    args = (
        "--node-id",
        "bp",
        "--route-port",
        "0",
        "--max-message-queue-size",
        "100",
        "--backpressure-policy",
        policy,
    )
    with StreamsServerProcess(extra_args=args) as node:
        node.start()
        peer = await asyncio.to_thread(RawPeer(node.route_url, "slow", "", "client").authenticate)
        peer.send(encode_frame(FrameType.SUB_ADD, "", "bp.flood"), encode_frame(FrameType.SYNC_REQ, ""))
        await asyncio.to_thread(peer.read_until, FrameType.SYNC_RESP)
        publisher = await MeshClient(node.route_url).connect()
        total = 40_000
        try:
            for i in range(total):
                await publisher.publish("bp.flood", i.to_bytes(4, "big") + b"\0" * 1000)
                if i % 1000 == 999:
                    await publisher.flush()
            await publisher.flush()

            async def slow_client() -> dict[str, Any]:
                return dict((await status(node))["clients"][0]) if (await status(node))["clients"] else {}

            if policy == "disconnect":
                await eventually(
                    lambda: _counter(node, "clients_disconnected_slow", 1), what="the slow client is dropped"
                )
                return
            client = await slow_client()
            assert client["dropped"] > 0
            assert client["queued"] <= 100
            seen = await asyncio.to_thread(drain_events, peer, total)
            assert seen == sorted(seen)
            assert len(seen) < total
            if policy == "drop_oldest":
                assert seen[-1] == total - 1  # the newest kept
            else:
                assert seen[-1] < total - 1  # the newest refused
            assert len(seen) + client["dropped"] == total
        finally:
            peer.close()
            await publisher.close()


def drain_events(peer: RawPeer, last: int) -> list[int]:
    """Read the numbered events until the last one, or until none came for a second (heartbeats
    keep coming: they do not count)."""
    sock = peer.sock
    sock.settimeout(0.2)
    seen: list[int] = []
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 1.0 and seen[-1:] != [last - 1]:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        assert data, "the node closed the connection"
        peer.receive(data)
        events = [f for f in peer.frames if f.type is FrameType.EVENT]
        peer.frames.clear()
        if events:
            quiet_since = time.monotonic()
            seen += [int.from_bytes(event_parts(f)[1][:4], "big") for f in events]
    return seen


async def _counter(node: StreamsServerProcess, name: str, at_least: int) -> bool:
    return bool((await status(node))["counters"].get(name, 0) >= at_least)


@pytest.mark.timeout(150)  # a burst of 200,000, waits of 60 s
async def test_a_burst_into_a_briefly_stalled_subscriber_arrives_whole() -> None:
    """200,000 events of 100 B while the subscriber reads nothing: at defaults the node holds them for
    it (nats-server holds 64 MB per connection) and every one arrives once the subscriber reads."""
    with MeshCluster(2) as cluster:
        cluster.start()
        await all_linked(cluster)
        subscriber = await MeshClient(cluster["b"].route_url).connect()
        publisher = await MeshClient(cluster["a"].route_url).connect()
        try:
            received = 0

            def count(subject: str, body: bytes) -> None:
                nonlocal received
                received += 1

            subscriber.subscribe("burst.x", count)
            await subscriber.flush()
            await interest_reached(cluster["a"], "b", "burst.x")
            stalled = subscriber._conn
            assert stalled is not None
            assert stalled.transport is not None
            stalled.transport.pause_reading()  # held back, as by a publisher sharing its loop
            body = b"x" * 100
            for _ in range(200_000):
                await publisher.publish("burst.x", body)
            await publisher.flush()

            async def subscriber_at_b() -> dict[str, Any]:
                (client,) = [c for c in (await status(cluster["b"]))["clients"] if c["patterns"]]
                return dict(client)

            async def all_at_b() -> bool:
                client = await subscriber_at_b()
                return bool(client["delivered"] + client["queued"] + client["dropped"] >= 200_000)

            await eventually(all_at_b, timeout=60, what="the burst at the subscriber's node")
            stalled.transport.resume_reading()

            async def settled() -> bool:
                return received + int((await subscriber_at_b())["dropped"]) >= 200_000

            await eventually(settled, timeout=60, what="every event of the burst delivered or dropped")
            assert (await subscriber_at_b())["dropped"] == 0
            assert received == 200_000
        finally:
            await publisher.close()
            await subscriber.close()
