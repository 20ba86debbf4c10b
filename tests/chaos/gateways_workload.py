"""Guaranteed mesh events across gateways (issue 36, item 3): cluster A (a1, its gateway, and a2) and
cluster B (b1, its gateway, and b2); publishers p1 (through a2) and p2 (through b2); a queue on every
node takes ``orders.>``, so each event crosses the external link once for the other cluster's two
queues. Faults hit the gateways: killed, powered off, paused, isolated, capped, and the external link
cut both ways or one way. At the end every queue's topic is read whole."""

from __future__ import annotations

import aiohttp

from tests.chaos.harness import ROUTE_PORT, Servers, Workload, streams_server
from tests.chaos.mesh_workload import mesh_state, queues_run
from tests.chaos.schedule import LINK_NEMESES

NODES = ("a1", "a2", "b1", "b2")
GATEWAYS = ("a1", "b1")


def node_args(servers: Servers, node: str) -> tuple[str, ...]:
    cluster = node[0]
    mate = next(other for other in NODES if other[0] == cluster and other != node)
    args = ["--node-id", node, "--cluster", cluster.upper(), "--route-port", str(ROUTE_PORT)]
    args += ["--heartbeat-interval", "0.2", "--routes", servers.peer_url(node, mate)]
    if node in GATEWAYS:
        other = next(gateway for gateway in GATEWAYS if gateway != node)
        args += ["--gateway", f"{other[0].upper()}={servers.peer_url(node, other)}"]
    return tuple(args)


async def ready(http: aiohttp.ClientSession, servers: Servers) -> bool:
    """Every internal link up, the external link up, and each gateway knowing the other cluster's
    queues."""
    for node in NODES:
        state = await mesh_state(http, servers, node)
        if state is None:
            return False
        if [link["state"] for link in state["links"]] != ["up"]:
            return False
        if node in GATEWAYS:
            other = "B" if node == "a1" else "A"
            if [g["state"] for g in state["gateways"] if g["cluster"] == other] != ["up"]:
                return False
            if "$G.orders.>" not in state["patterns"]["gateways"].get(other, []):
                return False
    return True


RUN = queues_run(NODES, {"p1": "a2", "p2": "b2"}, ready)
WORKLOAD = Workload(NODES, LINK_NEMESES, streams_server(node_args), RUN, targets=GATEWAYS, proxied=True)
