"""Guaranteed events on real nodes (issue 17): a queue on one node, publishers on another, and the
queue's node or the publisher's node killed with SIGKILL while guaranteed events keep coming."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshplane import EventPlane, PlaneConfig, Scope
from meshplane.errors import TransportError
from meshplane.launchers import MeshCluster, ServerError, StreamsServerProcess, free_port
from meshplane.mesh.client import MeshClient
from meshplane.streams.client import StreamsClient
from tests.helpers import eventually
from tests.support.cli import run_cli
from tests.support.mesh import Inbox, interest_reached, link, publish_all, put_queue, queue_bodies, status


@pytest.fixture
def pair() -> Iterator[MeshCluster]:
    with MeshCluster(2) as cluster:
        yield cluster.start()


@pytest.fixture(scope="module")
def shared_pair() -> Iterator[MeshCluster]:
    """A pair for the tests that neither stop nor restart a node: each has its own queue and subjects
    (queues on b only, but the command line's, on a)."""
    with MeshCluster(2) as cluster:
        yield cluster.start()


async def queue_on_b(pair: MeshCluster, name: str, pattern: str) -> None:
    """A queue on b, once a knows of it."""
    await put_queue(pair["b"], name, [pattern])
    await interest_reached(pair["a"], "b", "$G." + pattern)


async def publish_from(node: StreamsServerProcess, subject: str, bodies: list[bytes]) -> None:
    """Guaranteed publishes from a client of ``node``, all acknowledged."""
    publisher = await MeshClient(node.route_url).connect()
    try:
        await publish_all(publisher, subject, bodies)
    finally:
        await publisher.close()


async def test_events_for_a_dead_node_are_spooled_and_delivered_once_in_order_when_it_returns(
    pair: MeshCluster,
) -> None:
    await asyncio.to_thread(pair.wait_linked)
    await queue_on_b(pair, "orders-b", "g1.orders.>")
    direct = await MeshClient(pair["b"].route_url).connect()
    seen = Inbox()
    direct.subscribe("g1.orders.>", seen)
    await direct.flush(propagated=True)
    publisher = await MeshClient(pair["a"].route_url).connect()
    try:
        before = [b"before-%d" % i for i in range(300)]
        await publish_all(publisher, "g1.orders.eu", before)
        await eventually(lambda: len(seen.events) == 300, what="direct copies at b")

        pair["b"].kill(signal.SIGKILL)
        await eventually(lambda: link_state(pair["a"], "b", "down"), timeout=15, what="a sees b down")
        during = [b"during-%d" % i for i in range(500)]
        await publish_all(publisher, "g1.orders.eu", during)  # acknowledged: spooled on a
        for i in range(20):
            await publisher.publish("g1.orders.eu", b"direct-%d" % i)  # direct: lost, counted
        await publisher.flush()
        a_to_b = await link(pair["a"], "b")
        assert a_to_b["dropped_peer_down"] >= 20
        spool = (await status(pair["a"]))["guaranteed"]["spools"]
        assert [(s["peer"], s["pending"] >= 500) for s in spool] == [("b", True)]

        pair["b"].start()  # same data directory and ports
        after = [b"after-%d" % i for i in range(200)]
        await publish_all(publisher, "g1.orders.eu", after)

        expected = before + during + after

        async def all_there() -> bool:
            return len(await queue_bodies(pair["b"], "orders-b")) >= len(expected)

        await eventually(all_there, timeout=30, what="every guaranteed event in b's queue")
        assert await queue_bodies(pair["b"], "orders-b") == expected  # exactly once, in order
        await eventually(lambda: spool_empty(pair["a"]), timeout=15, what="a's spool confirmed")
    finally:
        await publisher.close()
        await direct.close()


async def link_state(node: StreamsServerProcess, peer: str, state: str) -> bool:
    return bool((await link(node, peer))["state"] == state)


async def spool_empty(node: StreamsServerProcess) -> bool:
    return all(s["pending"] == 0 for s in (await status(node))["guaranteed"]["spools"])


async def test_nothing_acknowledged_is_lost_when_the_publishing_node_dies_before_forwarding(
    pair: MeshCluster,
) -> None:
    """a acknowledges but (the fault) never forwards; SIGKILL a; restarted without the fault, a sends
    its spool: every acknowledged event reaches b's queue once."""
    pair["a"].stop()
    pair["a"]._extra_args = (*pair["a"]._extra_args, "--mesh-fault", "hold_spooled")
    pair["a"].start()
    await asyncio.to_thread(pair.wait_linked)
    await queue_on_b(pair, "held", "g2.>")
    bodies = [b"held-%d" % i for i in range(400)]
    await publish_from(pair["a"], "g2.x", bodies)
    assert await queue_bodies(pair["b"], "held") == []  # held back on a
    pair["a"].kill(signal.SIGKILL)
    pair["a"]._extra_args = pair["a"]._extra_args[:-2]
    pair["a"].start()

    async def delivered() -> bool:
        return len(await queue_bodies(pair["b"], "held")) >= len(bodies)

    await eventually(delivered, timeout=30, what="a's spool replayed after its restart")
    assert await queue_bodies(pair["b"], "held") == bodies


async def test_a_restarted_node_advertises_its_queues_before_it_takes_events(pair: MeshCluster) -> None:
    await asyncio.to_thread(pair.wait_linked)
    await put_queue(pair["b"], "kept", ["g3.>"])
    pair["b"].stop()
    pair["b"].start()
    await asyncio.to_thread(pair.wait_linked)
    # The link is up, so a knows b's queue already: the first event after it is kept.
    publisher = await MeshClient(pair["a"].route_url).connect()
    try:
        await publisher.publish("g3.first", b"first", guaranteed=True)
    finally:
        await publisher.close()
    await eventually(lambda: queue_has(pair["b"], "kept", [b"first"]), what="the first event kept")
    queues = (await status(pair["b"]))["guaranteed"]["queues"]
    assert [(q["name"], q["patterns"]) for q in queues] == [("kept", ["g3.>"])]


async def queue_has(node: StreamsServerProcess, name: str, bodies: list[bytes]) -> bool:
    return await queue_bodies(node, name) == bodies


async def test_a_full_spool_refuses_the_publish_and_says_why() -> None:
    with MeshCluster(2, node_args={"a": ("--spool-max-events", "5")}) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        await put_queue(cluster["b"], "small", ["g4.>"])
        await interest_reached(cluster["a"], "b", "$G.g4.>")
        cluster["b"].kill(signal.SIGKILL)
        publisher = await MeshClient(cluster["a"].route_url).connect()
        try:
            for i in range(5):
                await publisher.publish("g4.x", b"%d" % i, guaranteed=True)
            with pytest.raises(TransportError, match="spool for node 'b' is full"):
                await publisher.publish("g4.x", b"one too many", guaranteed=True)
        finally:
            await publisher.close()
        spools = (await status(cluster["a"]))["guaranteed"]["spools"]
        assert spools[0]["pending"] == 5
        assert spools[0]["refused"] == 1


async def test_publishes_in_flight_without_a_task_each_are_stored_in_order_or_fail_on_their_future(
    shared_pair: MeshCluster,
) -> None:
    pair = shared_pair
    await queue_on_b(pair, "pipelined", "g9.>")
    publisher = await MeshClient(pair["a"].route_url).connect()
    try:
        bodies = [b"%d" % i for i in range(3000)]
        answers = [await publisher.publish_async("g9.x", body) for body in bodies]
        refused = await publisher.publish_async("$G.reserved", b"never stored")
        await asyncio.gather(*answers)
        with pytest.raises(TransportError, match="did not store the event: subject"):
            await refused
        await eventually(lambda: queue_has(pair["b"], "pipelined", bodies), timeout=30)
    finally:
        await publisher.close()


async def test_bad_queue_requests_are_4xx(shared_pair: MeshCluster) -> None:
    pair = shared_pair
    bodies: list[dict[str, Any]] = [
        {},
        {"patterns": "x"},
        {"patterns": []},
        {"patterns": ["a..b"]},
        {"patterns": ["$G.x"]},
    ]
    async with aiohttp.ClientSession() as http:
        for body in bodies:
            async with http.put(f"{pair['a'].url}/mesh/queues/q", json=body) as response:
                assert response.status == 400, body
        async with http.delete(f"{pair['a'].url}/mesh/queues/missing") as response:
            assert response.status == 404


async def test_a_resend_of_stored_events_is_dropped_by_event_id_even_after_a_restart(
    pair: MeshCluster,
) -> None:
    """a forgets what b confirmed (its ``acked`` file gone) and b restarts: a sends its whole spool
    again, and b's queue keeps each event once (the last offset it stored from a's spool)."""
    await asyncio.to_thread(pair.wait_linked)
    await queue_on_b(pair, "once", "g5.>")
    bodies = [b"once-%d" % i for i in range(300)]
    await publish_from(pair["a"], "g5.x", bodies)
    await eventually(lambda: spool_empty(pair["a"]), timeout=15, what="b confirmed everything")
    [spool] = (await status(pair["a"]))["guaranteed"]["spools"]
    pair["a"].stop()
    pair["b"].stop()
    acked = pair["a"].data_dir / "mesh" / "spool" / b"b".hex() / "acked"
    assert int(acked.read_text()) == spool["acked"]
    acked.unlink()
    pair["b"].start()
    pair["a"].start()

    async def dropped() -> int:
        return int((await status(pair["b"]))["guaranteed"]["counters"].get("duplicates_dropped", 0))

    await eventually(lambda: spool_empty(pair["a"]), timeout=15, what="the resend confirmed")
    assert await dropped() == 300
    assert await queue_bodies(pair["b"], "once") == bodies


async def test_every_client_can_ask_for_guaranteed_delivery(shared_pair: MeshCluster, tmp_path: Path) -> None:
    """HTTP pub/sub, the WebSocket command channel and the event plane (MESHPLANE_GUARANTEED) publish
    guaranteed events that reach a queue on the other node."""
    pair = shared_pair
    await asyncio.to_thread(pair.wait_linked)
    scope = Scope.endpoint("ns", "comp", "ep")
    await put_queue(pair["b"], "all-clients", ["g6.>", scope.subject("t")])
    await interest_reached(pair["a"], "b", "$G." + scope.subject("t"))
    async with aiohttp.ClientSession() as http:
        for i in range(3):
            body = {"payload": {"i": i}, "guaranteed": True}
            async with http.post(f"{pair['a'].url}/pubsub/g6.http/publish", json=body) as response:
                answer = await response.json()
                assert response.status == 200, answer
                assert answer["guaranteed"] is True
    async with StreamsClient(pair["a"].url, channel=True) as over_websocket:
        for i in range(3):
            payload = {"topic": "g6.ws", "payload": {"ws": i}, "guaranteed": True}
            assert (await over_websocket.command("pubsub.publish", payload))["guaranteed"] is True
        assert over_websocket.channel_open  # the commands went over the WebSocket, not POST
    config = PlaneConfig(
        event_plane="mesh",
        discovery_backend="file",
        file_kv=tmp_path / "kv",
        mesh_node=pair["a"].route_url,
        mesh_guaranteed=True,
    )
    async with EventPlane(config) as plane:
        publisher = await plane.publisher(scope, "t")
        for i in range(3):
            await publisher.publish({"plane": i})  # returns once stored on a (spooled for b)

    async def events() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            url = f"{pair['b'].url}/topics/all-clients/partitions/0/consume"
            async with http.post(url, json={"limit": 100}) as response:
                page: dict[str, Any] = await response.json()
                return list(page["events"])

    async def nine() -> bool:
        return len(await events()) == 9

    await eventually(nine, what="three HTTP, three WebSocket and three event-plane events in b's queue")
    stored = await events()
    assert [e["data"] for e in stored[:6]] == [{"i": 0}, {"i": 1}, {"i": 2}, {"ws": 0}, {"ws": 1}, {"ws": 2}]
    assert {e["event_type"] for e in stored[6:]} == {scope.subject("t")}


async def test_guaranteed_without_a_mesh_node_is_a_400() -> None:
    with StreamsServerProcess() as server:
        server.start()
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{server.url}/pubsub/x/publish", json={"payload": 1, "guaranteed": True}) as response,
        ):
            assert response.status == 400
            assert "--node-id" in (await response.json())["error"]


async def test_queues_from_the_command_line(shared_pair: MeshCluster) -> None:
    async def cli(*argv: str) -> dict[str, Any]:  # on a: the other tests sharing the pair queue on b
        result = await asyncio.to_thread(run_cli, "mesh", *argv, "--url", shared_pair["a"].url, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer

    assert (await cli("queue-add", "cli-queue", "g7.>", "g8.*"))["patterns"] == ["g7.>", "g8.*"]
    listed = await cli("queues")
    assert [(q["name"], q["patterns"]) for q in listed["queues"]] == [("cli-queue", ["g7.>", "g8.*"])]
    assert (await cli("queue-delete", "cli-queue")) == {"deleted": "cli-queue"}
    assert (await cli("queues"))["queues"] == []


async def test_the_publishing_node_remembers_the_queues_of_a_node_that_is_down(pair: MeshCluster) -> None:
    """b is down and a restarts: a still spools for b's queue (it kept what b's queues want), and
    when b returns it gets everything."""
    await asyncio.to_thread(pair.wait_linked)
    await queue_on_b(pair, "remembered", "g9.>")
    pair["b"].kill(signal.SIGKILL)
    pair["a"].kill(signal.SIGKILL)
    pair["a"].start()
    bodies = [b"remembered-%d" % i for i in range(100)]
    await publish_from(pair["a"], "g9.x", bodies)
    spools = (await status(pair["a"]))["guaranteed"]["spools"]
    assert [(s["peer"], s["pending"]) for s in spools] == [("b", 100)]
    pair["b"].start()

    async def delivered() -> bool:
        return await queue_bodies(pair["b"], "remembered") == bodies

    await eventually(delivered, timeout=30, what="the events spooled by a restarted a")


@contextlib.asynccontextmanager
async def publishing(
    client: MeshClient, subject: str, count: int = 3000
) -> AsyncIterator[tuple[list[bytes], asyncio.Task[None]]]:
    """Guaranteed events published one after the other in the background (those acknowledged, and
    the task), from the 300th on."""
    acknowledged: list[bytes] = []

    async def run() -> None:
        for i in range(count):
            body = f"{subject}-{i}".encode()
            await client.publish(subject, body, guaranteed=True)
            acknowledged.append(body)

    task = asyncio.create_task(run())
    try:
        await eventually(lambda: len(acknowledged) >= 300, what="publishing under way")
        yield acknowledged, task
    finally:
        task.cancel()


async def test_a_node_killed_and_restarted_while_events_for_it_keep_coming_gets_each_once_in_order(
    pair: MeshCluster,
) -> None:
    await asyncio.to_thread(pair.wait_linked)
    await queue_on_b(pair, "steady", "g10.>")
    publisher = await MeshClient(pair["a"].route_url).connect()
    try:
        async with publishing(publisher, "g10.x") as (acknowledged, task):
            pair["b"].kill(signal.SIGKILL)
            killed_at = len(acknowledged)
            await eventually(lambda: len(acknowledged) >= killed_at + 500, what="publishing while b is down")
            pair["b"].start()
            await task
    finally:
        await publisher.close()

    async def complete() -> bool:
        return len(await queue_bodies(pair["b"], "steady")) >= len(acknowledged)

    await eventually(complete, timeout=30, what="every acknowledged event in b's queue")
    assert await queue_bodies(pair["b"], "steady") == acknowledged


def ha_trio(tmp_path: Path) -> tuple[StreamsServerProcess, StreamsServerProcess, StreamsServerProcess, str]:
    """Node a as two mates on one data directory (the second ``--standby``) and node b linked to both
    (not started); and the mates' route addresses."""
    a1_port, a2_port, b_port = free_port(), free_port(), free_port()
    common = ("--cluster", "ha", "--heartbeat-interval", "0.2", "--node-id")
    mates = [
        StreamsServerProcess(
            data_dir=tmp_path / "a",
            extra_args=(
                *common,
                "a",
                "--route-port",
                str(port),
                "--routes",
                f"tcp://127.0.0.1:{b_port}",
                *extra,
            ),
        )
        for port, extra in ((a1_port, ()), (a2_port, ("--standby",)))
    ]
    routes = [f"tcp://127.0.0.1:{a1_port}", f"tcp://127.0.0.1:{a2_port}"]
    b = StreamsServerProcess(
        extra_args=(*common, "b", "--route-port", str(b_port), "--routes", ",".join(routes))
    )
    return mates[0], mates[1], b, ",".join(routes)


async def test_the_standby_mate_takes_over_with_every_acknowledged_event(tmp_path: Path) -> None:
    """An HA pair: two processes with node id a on one data directory, the second ``--standby``.
    SIGKILL the active while b publishes guaranteed events for a's queue: the mate takes over, links
    and subscribers reattach, and a's queue holds every acknowledged event once, in order."""
    a1, a2, b, a_routes = ha_trio(tmp_path)
    with a1, a2, b:
        a1.start()
        a2.start(ready=False)
        b.start()
        await put_queue(a1, "ha", ["ha.>"])
        await interest_reached(b, "a", "$G.ha.>")
        with pytest.raises(ServerError, match="in use by another meshplane server"):
            StreamsServerProcess(data_dir=tmp_path / "a").start()  # without --standby: refused

        subscriber = await MeshClient(a_routes, timeout=30).connect()
        seen = Inbox()
        subscriber.subscribe("ha.>", seen)
        await subscriber.flush(propagated=True)
        publisher = await MeshClient(b.route_url).connect()
        try:
            async with publishing(publisher, "ha.x") as (acknowledged, task):
                a1.kill(signal.SIGKILL)
                await asyncio.to_thread(a2.wait_ready, 20)  # the mate has the lock and serves
                await task
        finally:
            await publisher.close()

        async def complete() -> bool:
            return len(await queue_bodies(a2, "ha")) >= len(acknowledged)

        await eventually(complete, timeout=30, what="every acknowledged event in the mate's queue")
        assert await queue_bodies(a2, "ha") == acknowledged
        # The subscriber reattached to the mate: what was published after the takeover reaches it.
        await eventually(lambda: seen.events[-1:] == [("ha.x", acknowledged[-1])], what="the subscriber back")
        await subscriber.close()


async def test_an_event_sent_into_the_dying_connection_is_sent_again_to_the_mate(tmp_path: Path) -> None:
    """Sent by b on the connection to the active mate as it dies: the active mate is stopped
    (SIGSTOP: its connection stays open), b sends the event on it (sent, not confirmed), then the
    mate is killed. b links to the standby: the new connection starts from what a confirmed, so
    the event is sent again."""
    a1, a2, b, _ = ha_trio(tmp_path)
    with a1, a2, b:
        a1.start()
        a2.start(ready=False)
        b.start()
        await put_queue(a1, "dying", ["dy.>"])
        await interest_reached(b, "a", "$G.dy.>")
        publisher = await MeshClient(b.route_url).connect()
        try:
            await publisher.publish("dy.x", b"before", guaranteed=True)
            a1.kill(signal.SIGSTOP)
            after = asyncio.create_task(publisher.publish("dy.x", b"after", guaranteed=True))

            async def sent_not_confirmed() -> bool:
                spools = {s["peer"]: s for s in (await status(b))["guaranteed"]["spools"]}
                return "a" in spools and spools["a"]["sent"] > spools["a"]["acked"]

            await eventually(
                sent_not_confirmed, timeout=10, what="'after' sent into the stopped mate's connection"
            )
            a1.kill(signal.SIGKILL)
            await asyncio.wait_for(after, 30)  # stored by the standby once it took over
        finally:
            await publisher.close()
        await asyncio.to_thread(a2.wait_ready, 20)
        await eventually(
            lambda: queue_has(a2, "dying", [b"before", b"after"]), timeout=15, what="both stored"
        )


async def publish_pipelined(node: StreamsServerProcess, subject: str, count: int, prefix: bytes) -> None:
    """``count`` guaranteed publishes from a client of ``node``, many in flight, all acknowledged."""
    publisher = await MeshClient(node.route_url, timeout=60).connect()
    try:
        answers = [await publisher.publish_async(subject, b"%s-%d" % (prefix, i)) for i in range(count)]
        await asyncio.gather(*answers)
    finally:
        await publisher.close()


@pytest.mark.timeout(300)
async def test_a_whole_spool_resent_after_a_restart_is_dropped_however_much_else_came_in_between(
    pair: MeshCluster,
) -> None:
    """Issue 53's reproduction: 5,000 events from a's spool into b's queue, then 55,000 published on
    b itself (more than the 50,000 ids a queue recalled on start, all ways mixed); both restart and a
    has lost what b confirmed (both ``acked`` files: a resend from the very start): b's queue keeps
    each event once, as it remembers per spool, durably, the last offset it stored."""
    await asyncio.to_thread(pair.wait_linked)
    await queue_on_b(pair, "qb", "g53.>")
    await publish_pipelined(pair["a"], "g53.x", 5000, b"from-a")
    await eventually(lambda: spool_empty(pair["a"]), timeout=60, what="b confirmed a's spool")
    await publish_pipelined(pair["b"], "g53.x", 55_000, b"on-b")
    pair["a"].stop()
    pair["b"].kill(signal.SIGKILL)
    spool = pair["a"].data_dir / "mesh" / "spool" / b"b".hex()
    for name in ("acked", "acked.synced"):
        (spool / name).unlink(missing_ok=True)
    pair["b"].start()
    pair["a"].start()
    await eventually(lambda: spool_empty(pair["a"]), timeout=60, what="the resend confirmed")
    bodies = await queue_bodies(pair["b"], "qb")
    assert len(bodies) == 60_000, f"{len(bodies) - 60_000} stored twice"
    assert len(set(bodies)) == 60_000
