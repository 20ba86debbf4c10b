"""Direct mesh events, at most once: nodes a, b, c of one cluster; publishers p1 (through a) and p2
(through c) publish ``ticks.<publisher>`` events with a sequence number, without waiting for any
answer; a subscriber on every node takes ``ticks.>``. Nothing is acknowledged, so nothing may be
lost; what a subscriber missed is counted as gaps (set beside the drops the nodes and clients
counted), and no subscriber may get an event twice, out of its publisher's order, or one never
published."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from meshplane.mesh.client import MeshClient
from tests.chaos.checker import Verdict, check_direct
from tests.chaos.harness import Servers, Workload, run_schedule, streams_server
from tests.chaos.mesh_workload import NODES, linked, node_args, parse
from tests.chaos.schedule import LINK_NEMESES, Fault


class Recorder:
    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.events = events

    def __call__(self, subject: str, body: bytes) -> None:
        self.events.append(parse(body))


async def publish_until(client: MeshClient, publisher: str, stop_at: float) -> int:
    """Publish until ``stop_at`` (monotonic), yielding now and then; returns how many were sent."""
    seq = 0
    while time.monotonic() < stop_at:
        await client.publish(f"ticks.{publisher}", b'{"p": "%s", "seq": %d}' % (publisher.encode(), seq))
        seq += 1
        if seq % 50 == 0:
            await asyncio.sleep(0.002)  # about 20,000 a second each: a steady stream, not a flood
    return seq


async def settled(received: dict[str, list[tuple[str, int]]], quiet: float, timeout: float) -> None:
    """Until no subscriber has got anything for ``quiet`` seconds (or ``timeout``): counted every
    tenth of a second, so the wait ends ``quiet`` after the last arrival, not up to twice that."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while (now := time.monotonic()) < deadline:
        count = sum(len(events) for events in received.values())
        if count != last:
            last, since = count, now
        elif now - since >= quiet:
            return
        await asyncio.sleep(0.1)


async def counted_drops(servers: Servers) -> int:
    """The events the nodes said they dropped: per link and per client session."""
    total = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for node in NODES:
            async with http.get(f"{servers.url(node)}/mesh") as response:
                state = await response.json()
            total += state["counters"].get("client_dropped_events", 0)
            total += sum(session["dropped"] for session in state["clients"])
            for link in state["links"]:
                total += link.get("dropped_peer_down", 0) + link.get("dropped_backpressure", 0)
    return total


async def run(servers: Servers, faults: list[Fault], duration: float, log: list[str]) -> dict[str, Verdict]:
    received: dict[str, list[tuple[str, int]]] = {f"s{node}": [] for node in NODES}
    subscribers = []
    for node in NODES:
        client = await MeshClient(servers.route_url(node), timeout=5.0).connect()
        client.subscribe("ticks.>", Recorder(received[f"s{node}"]))
        subscribers.append(client)
    publishers = {"p1": servers.route_url("a"), "p2": servers.route_url("c")}
    clients = {name: await MeshClient(url, timeout=5.0).connect() for name, url in publishers.items()}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            deadline = time.monotonic() + 30
            while not await linked(http, servers, "ticks.>"):
                if time.monotonic() > deadline:
                    raise TimeoutError("the nodes did not link and learn each other's subscriptions in 30s")
                await asyncio.sleep(0.1)
        stop_at = time.monotonic() + duration
        schedule = asyncio.create_task(run_schedule(servers, faults, log))
        sent = await asyncio.gather(*(publish_until(c, name, stop_at) for name, c in clients.items()))
        await schedule
        published = dict(zip(clients, sent, strict=True))
        await settled(received, quiet=2.0, timeout=60)
        drops = await counted_drops(servers) + sum(client.dropped_disconnected for client in clients.values())
    finally:
        for client in (*subscribers, *clients.values()):
            await client.close()
    verdicts = check_direct(published, received)
    gaps = sum(verdict.gaps for verdict in verdicts.values())
    copies = sum(published.values()) * len(received)
    log.append(
        f"published {sum(published.values())}; the subscribers missed {gaps} of {copies} copies; the "
        f"nodes and publishers counted {drops} drops (a node restarted counts afresh; a publisher's "
        "drop is every subscriber's)"
    )
    return verdicts


WORKLOAD = Workload(NODES, LINK_NEMESES, streams_server(node_args), run, at_most_once=True, proxied=True)
