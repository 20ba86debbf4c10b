"""Guaranteed mesh events: nodes a, b, c of one cluster; publishers p1 (through a) and p2 (through c)
publish one event at a time to ``orders.<publisher>`` and record every outcome; a queue on every node
takes ``orders.>``. At the end each queue's topic is read whole."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp

from meshplane.errors import TransportError
from meshplane.mesh.client import MeshClient
from tests.chaos.checker import Op, Verdict, check_queues
from tests.chaos.harness import ROUTE_PORT, Body, Servers, Workload, run_schedule, streams_server
from tests.chaos.schedule import LINK_NEMESES, Fault

NODES = ("a", "b", "c")


def body(publisher: str, seq: int) -> bytes:
    return json.dumps({"p": publisher, "seq": seq}).encode()


def parse(raw: bytes) -> tuple[str, int]:
    fields = json.loads(raw)
    return str(fields["p"]), int(fields["seq"])


async def publish_until(
    node_url: str, publisher: str, stop_at: float | Callable[[], float], history: list[Op]
) -> None:
    """Publish ``orders.<publisher>`` events one at a time until ``stop_at`` (monotonic; or what it
    returns, for a stop known only later)."""
    client = await MeshClient(node_url, timeout=5.0).connect()
    try:
        seq = 0
        while time.monotonic() < (stop_at() if callable(stop_at) else stop_at):
            try:
                await client.publish(f"orders.{publisher}", body(publisher, seq), guaranteed=True)
                history.append(Op(publisher, seq, "ok"))
            except TransportError:
                history.append(Op(publisher, seq, "unknown"))
            seq += 1
    finally:
        await client.close()


async def put_queue(http: aiohttp.ClientSession, url: str, name: str, patterns: list[str]) -> None:
    async with http.put(f"{url}/mesh/queues/{name}", json={"patterns": patterns}) as response:
        if response.status != 200:
            raise RuntimeError(f"PUT queue {name} at {url}: {response.status} {await response.text()}")


async def read_queue(http: aiohttp.ClientSession, url: str, name: str) -> list[tuple[str, int]]:
    """Everything the queue's topic holds, in order."""
    held: list[tuple[str, int]] = []
    offset = 0
    while True:
        request = {"from_offset": offset, "limit": 1000}
        async with http.post(f"{url}/topics/{name}/partitions/0/consume", json=request) as response:
            if response.status != 200:
                raise RuntimeError(
                    f"reading queue {name} at {url}: {response.status} {await response.text()}"
                )
            page: dict[str, Any] = await response.json()
        if not page["events"]:
            return held
        held.extend(parse(base64.b64decode(event["data"])) for event in page["events"])
        offset = page["next_offset"]


async def collect(
    queues: dict[str, str],
    history: Iterable[Op],
    timeout: float,
    settle: float = 0.0,
    topic_of: Callable[[str], str] = lambda name: name,
) -> dict[str, list[tuple[str, int]]]:
    """Each queue (name -> its node's URL; its topic ``topic_of(name)``) read whole, once it holds
    every acknowledged event or ``timeout`` has passed (what is missing then is lost); with ``settle``,
    only once two reads that many seconds apart are the same (nothing still arriving or going)."""
    acknowledged = {(op.publisher, op.seq) for op in history if op.outcome == "ok"}
    deadline = time.monotonic() + timeout
    before: dict[str, list[tuple[str, int]]] | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        while True:
            held: dict[str, list[tuple[str, int]]] = {}
            try:
                for name, url in queues.items():
                    held[name] = await read_queue(http, url, topic_of(name))
            except (aiohttp.ClientError, TimeoutError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
                continue
            now = time.monotonic()
            done = now > deadline or all(acknowledged <= set(items) for items in held.values())
            if done and (not settle or held == before or now > deadline + 4 * settle):
                return held
            before = held if done else None
            await asyncio.sleep(settle if done else 0.5)


def node_args(servers: Servers, node: str) -> tuple[str, ...]:
    routes = ",".join(servers.peer_url(node, peer) for peer in NODES if peer != node)
    ids = ("--node-id", node, "--cluster", "c1", "--route-port", str(ROUTE_PORT))
    return (*ids, "--heartbeat-interval", "0.2", "--routes", routes)


async def mesh_state(http: aiohttp.ClientSession, servers: Servers, node: str) -> dict[str, Any] | None:
    """``GET /mesh?patterns=1`` of ``node``; None while it does not answer."""
    try:
        async with http.get(f"{servers.url(node)}/mesh", params={"patterns": "1"}) as response:
            state: dict[str, Any] = await response.json()
            return state
    except (aiohttp.ClientError, TimeoutError):
        return None


async def linked(http: aiohttp.ClientSession, servers: Servers, pattern: str) -> bool:
    """Every node up on a link to every other and knowing the others' ``pattern``."""
    for node in NODES:
        state = await mesh_state(http, servers, node)
        if state is None:
            return False
        peers = [peer for peer in NODES if peer != node]
        if sorted(link["peer"] for link in state["links"] if link["state"] == "up") != peers:
            return False
        if not all(pattern in state["patterns"]["peers"].get(peer, []) for peer in peers):
            return False
    return True


def queues_run(
    nodes: Iterable[str],
    publishers: dict[str, str],
    ready: Callable[[aiohttp.ClientSession, Servers], Awaitable[bool]],
) -> Body:
    """A queue on each of ``nodes`` taking ``orders.>``; once ``ready``, each publisher (name -> the
    node it publishes through) publishes until the duration is over; every queue read whole."""

    async def run(
        servers: Servers, faults: list[Fault], duration: float, log: list[str]
    ) -> dict[str, Verdict]:
        queues = {f"q{node}": servers.url(node) for node in nodes}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for name, url in queues.items():
                await put_queue(http, url, name, ["orders.>"])
            deadline = time.monotonic() + 30
            while not await ready(http, servers):
                if time.monotonic() > deadline:
                    raise TimeoutError("the nodes did not link and learn each other's queues within 30s")
                await asyncio.sleep(0.1)
        history: list[Op] = []
        stop_at = time.monotonic() + duration
        tasks = [
            publish_until(servers.route_url(node), name, stop_at, history)
            for name, node in publishers.items()
        ]
        await asyncio.gather(run_schedule(servers, faults, log), *tasks)
        log.append(f"published {len(history)}, collecting")
        held = await collect(queues, history, timeout=90)
        return check_queues(history, held, lambda queue, publisher: True)

    return run


async def cluster_ready(http: aiohttp.ClientSession, servers: Servers) -> bool:
    return await linked(http, servers, "$G.orders.>")


RUN = queues_run(NODES, {"p1": "a", "p2": "c"}, cluster_ready)
WORKLOAD = Workload(NODES, LINK_NEMESES, streams_server(node_args), RUN, proxied=True)
