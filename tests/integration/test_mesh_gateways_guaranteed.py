"""Guaranteed events across gateways (issue 36, item 3): two clusters, A (a1 its gateway, a2) and B
(b1 its gateway, b2), each node its own process. A queue's interest crosses the external link; the
gateway spools per other cluster; every acknowledged event reaches the queue once, in publisher
order, through SIGKILLs of either gateway."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import aiohttp
import pytest

from meshplane.launchers import StreamsServerProcess, free_port
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.mesh import Inbox, publish_all, put_queue, queue_bodies, status


class TwoClusters:
    """Given ``mate_dir``, B's gateway is an HA pair on that data directory: b1 and its standby b1s."""

    def __init__(self, mate_dir: Path | None = None, extra_args: tuple[str, ...] = ()) -> None:
        names = ("a1", "a2", "b1", "b2", *(("b1s",) if mate_dir else ()))
        ports = {name: free_port() for name in names}
        url = {name: f"tcp://127.0.0.1:{port}" for name, port in ports.items()}
        b1 = url["b1"] + ("," + url["b1s"] if mate_dir else "")
        peers = {"a1": url["a2"], "a2": url["a1"], "b1": url["b2"], "b1s": url["b2"], "b2": b1}
        gateways = {"a1": "B=" + b1, "b1": "A=" + url["a1"], "b1s": "A=" + url["a1"]}
        self.nodes: dict[str, StreamsServerProcess] = {}
        for name, port in ports.items():
            args = ["--node-id", name[:2], "--cluster", name[0].upper(), "--route-port", str(port)]
            args += ["--heartbeat-interval", "0.2", "--routes", peers[name], *extra_args]
            if name in gateways:
                args += ["--gateway", gateways[name]]
            if name == "b1s":
                args += ["--standby"]
            data_dir = mate_dir if mate_dir and name.startswith("b1") else None
            self.nodes[name] = StreamsServerProcess(data_dir=data_dir, extra_args=tuple(args))

    def __getitem__(self, name: str) -> StreamsServerProcess:
        return self.nodes[name]


@contextlib.contextmanager
def running(topo: TwoClusters) -> Iterator[TwoClusters]:
    """Every node of ``topo`` started, and stopped by PID at the end."""
    try:
        for node in topo.nodes.values():  # booting side by side, as MeshCluster's nodes do
            node.start(ready=False)
        for node in topo.nodes.values():
            node.wait_ready()
        yield topo
    finally:
        for node in topo.nodes.values():
            node.cleanup()


@pytest.fixture
def clusters() -> Iterator[TwoClusters]:
    with running(TwoClusters()) as topo:
        yield topo


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


async def spool_confirmed(gateway: StreamsServerProcess, cluster: str) -> bool:
    """Everything the gateway spooled for ``cluster`` confirmed, in ``GET /mesh`` and the metrics."""
    link = next(g for g in (await status(gateway))["gateways"] if g["cluster"] == cluster)
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/metrics") as response:
        metrics = await response.text()
    line = f'meshplane_mesh_gateway_spool_pending{{cluster="{cluster}"}} 0.0'
    return link["spool"]["pending"] == 0 and link["spool"]["acked"] > 0 and line in metrics


async def delivered(node: StreamsServerProcess, queue: str, count: int) -> bool:
    return len(await queue_bodies(node, queue)) >= count


@pytest.mark.timeout(270)
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
        await eventually(lambda: spool_confirmed(clusters["a1"], "B"), what="a1's spool for B confirmed")
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
        # Never spooled: not waiting, and not sent and confirmed either.
        assert [(s["peer"], s["pending"], s["sent"]) for s in spools if s["pending"] or s["sent"]] == []
    finally:
        await publisher.close()
    url = f"{clusters['b2'].url}/mesh/queues/only-b"
    async with aiohttp.ClientSession() as http, http.delete(url) as response:
        assert response.status == 200

    async def withdrawn() -> bool:
        return not await queue_known(clusters["a2"], "a1", "gw.only.>")

    await eventually(withdrawn, timeout=15, what="the queue's interest withdrawn across the gateways")


@pytest.mark.timeout(180)
async def test_a_gateway_mate_takes_over_with_the_spool_for_the_other_cluster(tmp_path: Path) -> None:
    """B's gateway is an HA pair; SIGKILL its active mate while A publishes for b2's queue: the
    standby takes over with what the active had stored, and b2's queue holds every event once, in
    order."""
    topo = TwoClusters(mate_dir=tmp_path / "b1")
    try:
        for name in ("a1", "a2", "b1", "b2"):
            topo[name].start()
        topo["b1s"].start(ready=False)
        await put_queue(topo["b2"], "mated", ["gw.mated.>"])
        await eventually(lambda: queue_known(topo["a2"], "a1", "gw.mated.>"), timeout=20, what="$G at a2")
        publisher = await MeshClient(topo["a2"].route_url).connect()
        try:
            bodies = [b"m-%d" % i for i in range(1500)]
            publishing = asyncio.create_task(publish_all(publisher, "gw.mated.x", bodies))
            await eventually(partial(delivered, topo["b2"], "mated", 200), timeout=20, what="flowing")
            topo["b1"].kill(signal.SIGKILL)
            await asyncio.to_thread(topo["b1s"].wait_ready, 20)  # the mate has the lock and serves
            await publishing
        finally:
            await publisher.close()
        await eventually(partial(delivered, topo["b2"], "mated", len(bodies)), timeout=60, what="all at b2")
        assert await queue_bodies(topo["b2"], "mated") == bodies
    finally:
        for node in topo.nodes.values():
            node.cleanup()
