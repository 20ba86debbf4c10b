"""Clusters joined by gateways (seed 002's topology): cluster A (nodes a1, the gateway, and a2) with
external links to B and C; B also linked to D. Each node its own process."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import aiohttp
import pytest

from meshplane.launchers import StreamsServerProcess, free_port
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.mesh import status


class Topology:
    """a1 (gateway of A: to B and C), a2 (A), b1 (gateway of B: to A and D), c1 (C), d1 (D)."""

    def __init__(self) -> None:
        ports = {name: free_port() for name in ("a1", "a2", "b1", "c1", "d1")}
        url = {name: f"tcp://127.0.0.1:{port}" for name, port in ports.items()}
        cluster = {"a1": "A", "a2": "A", "b1": "B", "c1": "C", "d1": "D"}
        gateways = {
            "a1": ("B=" + url["b1"], "C=" + url["c1"]),
            "b1": ("A=" + url["a1"], "D=" + url["d1"]),
            "c1": ("A=" + url["a1"],),
            "d1": ("B=" + url["b1"],),
        }
        routes = {"a1": (url["a2"],), "a2": (url["a1"],)}
        self.nodes: dict[str, StreamsServerProcess] = {}
        for name, port in ports.items():
            args = ["--node-id", name, "--cluster", cluster[name], "--route-port", str(port)]
            args += ["--heartbeat-interval", "0.2"]
            if routes.get(name):
                args += ["--routes", ",".join(routes[name])]
            for gateway in gateways.get(name, ()):
                args += ["--gateway", gateway]
            self.nodes[name] = StreamsServerProcess(extra_args=tuple(args))

    def __getitem__(self, name: str) -> StreamsServerProcess:
        return self.nodes[name]


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    topo = Topology()
    try:
        for node in topo.nodes.values():
            node.start()
        yield topo
    finally:
        for node in topo.nodes.values():
            node.cleanup()


def gateway(answer: dict[str, Any], cluster: str) -> dict[str, Any]:
    return next(g for g in answer["gateways"] if g["cluster"] == cluster)


async def all_gateways_up(topo: Topology) -> None:
    expected = {"a1": {"B", "C"}, "b1": {"A", "D"}, "c1": {"A"}, "d1": {"B"}}

    async def up() -> bool:
        for name, clusters in expected.items():
            answer = await status(topo[name])
            if {g["cluster"] for g in answer["gateways"] if g["state"] == "up"} != clusters:
                return False
        a2 = await status(topo["a2"])
        return [link["state"] for link in a2["links"]] == ["up"]

    await eventually(up, timeout=20, interval=0.05, what="every external and internal link up")


async def knows(node: StreamsServerProcess, cluster: str, pattern: str) -> bool:
    answer = await status(node)
    return pattern in answer["patterns"]["gateways"].get(cluster, [])


class Inbox:
    def __init__(self) -> None:
        self.events: list[tuple[str, bytes]] = []

    def __call__(self, subject: str, body: bytes) -> None:
        self.events.append((subject, body))


async def client(topo: Topology, name: str) -> MeshClient:
    return await MeshClient(topo[name].route_url).connect()


async def test_interest_crosses_one_external_link_and_is_never_passed_on(topology: Topology) -> None:
    await all_gateways_up(topology)
    a2, d1 = await client(topology, "a2"), await client(topology, "d1")
    try:
        a2.subscribe("pay.>", Inbox())
        d1.subscribe("dd.>", Inbox())
        await a2.flush(propagated=True)
        await d1.flush(propagated=True)
        await eventually(lambda: knows(topology["b1"], "A", "pay.>"), what="B learns A's subscription")
        await eventually(lambda: knows(topology["c1"], "A", "pay.>"), what="C learns A's subscription")
        await eventually(lambda: knows(topology["b1"], "D", "dd.>"), what="B learns D's subscription")
        # Markers: interest of B's and A's own, made after B and A learnt the rest, crosses the same
        # external links after anything they wrongly passed on would have.
        b1, a1 = await client(topology, "b1"), await client(topology, "a1")
        b1.subscribe("mark.b", Inbox())
        a1.subscribe("mark.a", Inbox())
        await b1.flush(propagated=True)
        await a1.flush(propagated=True)
        for at, cluster, marker in (("d1", "B", "mark.b"), ("a1", "B", "mark.b"), ("c1", "A", "mark.a")):
            await eventually(partial(knows, topology[at], cluster, marker), what=f"{at} learns {marker}")
        assert not await knows(topology["d1"], "B", "pay.>")  # B does not re-transmit A's interest
        assert not await knows(topology["a1"], "B", "dd.>")  # nor D's to A
        assert not await knows(topology["c1"], "A", "dd.>")
        await b1.close()
        await a1.close()
    finally:
        await a2.close()
        await d1.close()


async def test_events_reach_exactly_the_clusters_with_interest_over_a_shared_link(topology: Topology) -> None:
    await all_gateways_up(topology)
    names = ("a1", "a2", "b1", "c1", "d1")
    clients = {name: await client(topology, name) for name in names}
    try:
        inboxes = {name: Inbox() for name in names}
        for name in names:
            clients[name].subscribe("evt.>", inboxes[name])
        for name in names:
            await clients[name].flush(propagated=True)
        for cluster, at in (("A", "b1"), ("A", "c1"), ("B", "a1"), ("C", "a1"), ("B", "d1"), ("D", "b1")):
            node = topology[at]
            await eventually(lambda node=node, cluster=cluster: knows(node, cluster, "evt.>"))  # type: ignore[misc]
        for name in names:
            await clients[name].publish(f"evt.{name}", name.encode())
            await clients[name].flush()
        # Who shares an external link with whom (or is in the same cluster): A-B, A-C, B-D.
        reach = {
            "a1": {"a1", "a2", "b1", "c1"},
            "a2": {"a1", "a2", "b1", "c1"},
            "b1": {"b1", "a1", "a2", "d1"},
            "c1": {"c1", "a1", "a2"},
            "d1": {"d1", "b1"},
        }
        expected = {name: sorted(f"evt.{src}" for src in names if name in reach[src]) for name in names}
        await eventually(lambda: all(len(inboxes[n].events) >= len(expected[n]) for n in names), timeout=15)
        # Each node forwards on receipt: after a marker from every node, published now, has arrived
        # wherever it goes, whatever was wrongly passed on before it (on the same links) has too.
        for name in names:
            await clients[name].publish(f"evt.end.{name}", b"")
            await clients[name].flush()

        def markers_in(n: str) -> bool:
            return sum(s.startswith("evt.end.") for s, _ in inboxes[n].events) == len(expected[n])

        await eventually(lambda: all(markers_in(n) for n in names), timeout=15, what="every marker")
        got = {n: sorted(s for s, _ in inboxes[n].events if not s.startswith("evt.end.")) for n in names}
        assert got == expected
    finally:
        for c in clients.values():
            await c.close()


async def test_one_copy_per_external_link_and_one_advertisement_per_cluster(topology: Topology) -> None:
    await all_gateways_up(topology)
    before = gateway(await status(topology["c1"]), "A")
    subscribers = [await client(topology, "c1") for _ in range(100)]
    same = [await client(topology, name) for name in ("a1", "a2", "a2")]  # one pattern, three holders in A
    publisher = await client(topology, "a2")
    try:
        inboxes = [Inbox() for _ in subscribers]
        for sub, inbox in zip(subscribers, inboxes, strict=True):
            sub.subscribe("fan.x", inbox)
        for sub in subscribers:
            await sub.flush(propagated=True)
        for holder in same:
            holder.subscribe("agg.x", Inbox())
            await holder.flush(propagated=True)
        await eventually(lambda: knows(topology["a1"], "C", "fan.x"))
        await eventually(lambda: knows(topology["c1"], "A", "agg.x"))
        sent_before = gateway(await status(topology["a1"]), "C")["events_out"]
        for i in range(20):
            await publisher.publish("fan.x", b"%d" % i)
        await publisher.flush()
        await eventually(lambda: all(len(inbox.events) == 20 for inbox in inboxes), timeout=20)
        assert gateway(await status(topology["a1"]), "C")["events_out"] - sent_before == 20
        after = gateway(await status(topology["c1"]), "A")
        assert after["sub_add_in"] - before["sub_add_in"] == 1  # agg.x: three holders, one advertisement
    finally:
        for c in [*subscribers, *same, publisher]:
            await c.close()


async def test_external_links_are_in_the_metrics(topology: Topology) -> None:
    await all_gateways_up(topology)
    async with aiohttp.ClientSession() as http, http.get(f"{topology['a1'].url}/metrics") as response:
        text = await response.text()
    assert 'meshplane_mesh_gateway_up{cluster="B"} 1.0' in text
    assert 'meshplane_mesh_gateway_up{cluster="C"} 1.0' in text
    assert "meshplane_mesh_gateway_events_out_total" in text
