"""Guaranteed events across gateways (issue 36, item 3): two clusters, A (a1 its gateway, a2) and B
(b1 its gateway, b2), each node its own process. A queue's interest crosses the external link; the
gateway spools per other cluster; every acknowledged event reaches the queue once, in publisher
order, through SIGKILLs of either gateway."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from functools import partial

import aiohttp
import pytest

from meshplane.launchers import StreamsServerProcess, free_port
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.integration.test_mesh import Inbox
from tests.integration.test_mesh_gateways import status
from tests.integration.test_mesh_guaranteed import publish_all, put_queue, queue_bodies


class TwoClusters:
    def __init__(self) -> None:
        ports = {name: free_port() for name in ("a1", "a2", "b1", "b2")}
        url = {name: f"tcp://127.0.0.1:{port}" for name, port in ports.items()}
        peers = {"a1": "a2", "a2": "a1", "b1": "b2", "b2": "b1"}
        gateways = {"a1": "B=" + url["b1"], "b1": "A=" + url["a1"]}
        self.nodes: dict[str, StreamsServerProcess] = {}
        for name, port in ports.items():
            args = ["--node-id", name, "--cluster", name[0].upper(), "--route-port", str(port)]
            args += ["--heartbeat-interval", "0.2", "--routes", url[peers[name]]]
            if name in gateways:
                args += ["--gateway", gateways[name]]
            self.nodes[name] = StreamsServerProcess(extra_args=tuple(args))

    def __getitem__(self, name: str) -> StreamsServerProcess:
        return self.nodes[name]


@pytest.fixture
def clusters() -> Iterator[TwoClusters]:
    topo = TwoClusters()
    try:
        for node in topo.nodes.values():
            node.start()
        yield topo
    finally:
        for node in topo.nodes.values():
            node.cleanup()


async def all_up(topo: TwoClusters) -> None:
    async def up() -> bool:
        for name, cluster in (("a1", "B"), ("b1", "A")):
            answer = await status(topo[name])
            if [g["state"] for g in answer["gateways"] if g["cluster"] == cluster] != ["up"]:
                return False
        for name in topo.nodes:
            if [link["state"] for link in (await status(topo[name]))["links"]] != ["up"]:
                return False
        return True

    await eventually(up, timeout=20, interval=0.05, what="every external and internal link up")


async def queue_known(node: StreamsServerProcess, peer: str, pattern: str) -> bool:
    """``node`` spools for ``peer`` what matches ``pattern``: it knows a queue there wants it."""
    answer = await status(node)
    peers = answer["patterns"]["peers"]
    return ("$G." + pattern) in peers.get(peer, [])


async def delivered(node: StreamsServerProcess, queue: str, count: int) -> bool:
    return len(await queue_bodies(node, queue)) >= count


@pytest.mark.timeout(180)
async def test_guaranteed_events_cross_the_gateways_once_in_order_through_gateway_kills(
    clusters: TwoClusters,
) -> None:
    await all_up(clusters)
    await put_queue(clusters["b2"], "orders-b2", ["gw.orders.>"])
    await put_queue(clusters["b1"], "orders-b1", ["gw.orders.eu"])  # a queue on the gateway itself
    # The queue's interest crossed the external link: a2 spools for its gateway.
    await eventually(lambda: queue_known(clusters["a2"], "a1", "gw.orders.>"), timeout=15, what="$G at a2")
    direct = await MeshClient(clusters["b2"].route_url).connect()
    seen = Inbox()
    direct.subscribe("gw.orders.>", seen)
    await direct.flush(propagated=True)
    publisher = await MeshClient(clusters["a2"].route_url).connect()
    try:
        first = [b"first-%d" % i for i in range(200)]
        await publish_all(publisher, "gw.orders.eu", first)
        await eventually(lambda: delivered(clusters["b2"], "orders-b2", 200), timeout=20, what="first at b2")
        assert await queue_bodies(clusters["b2"], "orders-b2") == first
        assert await queue_bodies(clusters["b1"], "orders-b1") == first
        await eventually(lambda: len(seen.events) >= 200, what="direct copies at b2")
        assert [body for _, body in seen.events] == first  # one direct copy each, not two

        expected = list(first)
        for name in ("a1", "b1"):  # each gateway in turn dies while events keep coming
            batch = [b"%s-%d" % (name.encode(), i) for i in range(600)]
            publishing = asyncio.create_task(publish_all(publisher, "gw.orders.eu", batch))
            await eventually(partial(delivered, clusters["b2"], "orders-b2", len(expected) + 100), timeout=20)
            clusters[name].kill(signal.SIGKILL)
            clusters[name].start()  # same data directory and ports
            await publishing
            expected += batch
            everything = partial(delivered, clusters["b2"], "orders-b2", len(expected))
            await eventually(everything, timeout=60, what="every event at b2")
            assert await queue_bodies(clusters["b2"], "orders-b2") == expected  # once each, in order
        await eventually(lambda: delivered(clusters["b1"], "orders-b1", len(expected)), timeout=30)
        assert await queue_bodies(clusters["b1"], "orders-b1") == expected
    finally:
        await publisher.close()
        await direct.close()


async def test_a_queue_crosses_only_as_guaranteed_interest_and_leaves_when_deleted(
    clusters: TwoClusters,
) -> None:
    """Queues' interest crosses once, aggregated, and is withdrawn with the queue; an event nobody's
    queue wants is acknowledged without being spooled for the other cluster."""
    await all_up(clusters)
    await put_queue(clusters["b2"], "only-b", ["gw.only.>"])
    await eventually(lambda: queue_known(clusters["a2"], "a1", "gw.only.>"), timeout=15, what="$G at a2")
    external = (await status(clusters["b1"]))["patterns"]["gateways"]["A"]
    assert "$G.gw.only.>" not in external  # B's queue is not advertised back to B's side
    publisher = await MeshClient(clusters["a2"].route_url).connect()
    try:
        await publisher.publish("gw.nobody.x", b"unwanted", guaranteed=True)
        spools = (await status(clusters["a2"]))["guaranteed"]["spools"]
        assert all(s["pending"] == 0 for s in spools)
    finally:
        await publisher.close()
    url = f"{clusters['b2'].url}/mesh/queues/only-b"
    async with aiohttp.ClientSession() as http, http.delete(url) as response:
        assert response.status == 200

    async def withdrawn() -> bool:
        return not await queue_known(clusters["a2"], "a1", "gw.only.>")

    await eventually(withdrawn, timeout=15, what="the queue's interest withdrawn across the gateways")
