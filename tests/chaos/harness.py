"""One run: build the namespaces, start real nodes in them, run a workload while the schedule's
faults come and go, heal everything, read the final state, check it.

The harness process itself moves into the ``client`` namespace (``setns``, before it opens a socket
or starts a thread), so it reaches the nodes as a client on another machine would; ``ip -n`` and
signals reach every namespace from there.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from meshplane.launchers import StreamsServerProcess
from tests.chaos import mesh_workload
from tests.chaos.checker import Op, Verdict, check_queues, combined
from tests.chaos.network import Network, can_build
from tests.chaos.schedule import NEMESES, Fault, plan

CLONE_NEWNET = 0x40000000
HTTP_PORT, ROUTE_PORT = 8080, 7000


def enter(ns_path: str) -> None:
    """This thread (and those it starts later) into the network namespace at ``ns_path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(ns_path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns_path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


@dataclass
class Report:
    workload: str
    nemeses: list[str]
    seed: int
    duration: float
    faults: list[Fault]
    verdicts: dict[str, Verdict]
    log: list[str] = field(default_factory=list)

    @property
    def total(self) -> Verdict:
        return combined(self.verdicts.values())

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": asdict(self.total), "valid": self.total.valid}


class MeshNodes:
    """Nodes a, b, c of one cluster, one per namespace, each routed to the others."""

    def __init__(self, network: Network, ids: tuple[str, ...], fsync: str) -> None:
        self.network = network
        self.ids = ids
        self.nodes = {
            node: StreamsServerProcess(
                port=HTTP_PORT,
                extra_args=(
                    *("--host", network.address(node), "--node-id", node, "--cluster", "c1"),
                    *("--route-port", str(ROUTE_PORT), "--heartbeat-interval", "0.2", "--fsync", fsync),
                    "--routes",
                    ",".join(self.route_url(peer) for peer in ids if peer != node),
                ),
                launcher=network.exec_prefix(node),
            )
            for node in ids
        }
        self.active: Fault | None = None  # the fault applied now, if any

    def route_url(self, node: str) -> str:
        return f"tcp://{self.network.address(node)}:{ROUTE_PORT}"

    def url(self, node: str) -> str:
        return f"http://{self.network.address(node)}:{HTTP_PORT}"

    def start(self) -> None:
        for node in self.nodes.values():
            node.start(timeout=30)

    def stop(self) -> None:
        if self.active is not None:
            self.heal(self.active)
        for node in self.nodes.values():
            node.cleanup()

    def apply(self, fault: Fault) -> None:
        net = self.network
        first = fault.hosts[0]
        match fault.kind:
            case "isolate":
                net.isolate(first)
            case "cap":
                net.cap(first, "300kbit")
            case "kill":
                self.nodes[first].kill(signal.SIGKILL)
            case "pause":
                self.nodes[first].kill(signal.SIGSTOP)
            case "cut":
                net.drop(first, fault.hosts[1])
                net.drop(fault.hosts[1], first)
            case "one-way":
                net.drop(first, fault.hosts[1])
        self.active = fault

    def heal(self, fault: Fault) -> None:
        net = self.network
        first = fault.hosts[0]
        match fault.kind:
            case "isolate":
                net.rejoin(first)
            case "cap":
                net.uncap(first)
            case "kill":
                self.nodes[first].start(timeout=30)
            case "pause":
                self.nodes[first].kill(signal.SIGCONT)
            case "cut":
                net.undrop(first, fault.hosts[1])
                net.undrop(fault.hosts[1], first)
            case "one-way":
                net.undrop(first, fault.hosts[1])
        self.active = None

    async def wait_linked(self, http: aiohttp.ClientSession, timeout: float = 30.0) -> None:
        """Every node up on a link to every other, and knowing the others' queues (``queues``)."""
        deadline = time.monotonic() + timeout
        while not await self._linked(http):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the nodes did not link within {timeout}s")
            await asyncio.sleep(0.1)

    async def _linked(self, http: aiohttp.ClientSession) -> bool:
        for node in self.ids:
            try:
                async with http.get(f"{self.url(node)}/mesh") as response:
                    links = (await response.json())["links"]
            except (aiohttp.ClientError, TimeoutError):
                return False
            if sorted(link["peer"] for link in links if link["state"] == "up") != [
                p for p in self.ids if p != node
            ]:
                return False
        return True

    async def wait_known(self, http: aiohttp.ClientSession, pattern: str, timeout: float = 30.0) -> None:
        """Every node knows every other's ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            known = True
            for node in self.ids:
                async with http.get(f"{self.url(node)}/mesh", params={"patterns": "1"}) as response:
                    peers = (await response.json())["patterns"]["peers"]
                known &= all(pattern in peers.get(peer, []) for peer in self.ids if peer != node)
            if known:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pattern} did not reach every node within {timeout}s")
            await asyncio.sleep(0.1)


async def run_schedule(
    faults: list[Fault], apply: Callable[[Fault], None], heal: Callable[[Fault], None], log: list[str]
) -> None:
    began = time.monotonic()
    for fault in faults:
        await asyncio.sleep(max(0.0, began + fault.start - time.monotonic()))
        log.append(f"{time.monotonic() - began:6.1f}s apply {fault.describe()}")
        await asyncio.to_thread(apply, fault)
        await asyncio.sleep(max(0.0, began + fault.start + fault.length - time.monotonic()))
        await asyncio.to_thread(heal, fault)
        log.append(f"{time.monotonic() - began:6.1f}s heal  {fault.kind}")


async def mesh_guaranteed(
    nodes: MeshNodes, faults: list[Fault], duration: float, log: list[str]
) -> dict[str, Verdict]:
    """Publishers p1 (through a) and p2 (through c); a queue on every node takes ``orders.>``."""
    queues = {f"q{node}": nodes.url(node) for node in nodes.ids}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await nodes.wait_linked(http)
        for name, url in queues.items():
            await mesh_workload.put_queue(http, url, name, ["orders.>"])
        await nodes.wait_known(http, "$G.orders.>")
    history: list[Op] = []
    stop_at = time.monotonic() + duration
    publishers = {"p1": nodes.route_url("a"), "p2": nodes.route_url("c")}
    tasks = [mesh_workload.publish_until(url, name, stop_at, history) for name, url in publishers.items()]
    await asyncio.gather(run_schedule(faults, nodes.apply, nodes.heal, log), *tasks)
    log.append(f"published {len(history)}, collecting")
    held = await mesh_workload.collect(queues, history, timeout=90)
    return check_queues(history, held, lambda queue, publisher: True)


WORKLOADS = {"mesh-guaranteed": mesh_guaranteed}


def run(workload: str, seed: int, duration: float, nemeses: list[str], fsync: str = "always") -> Report:
    """Run one schedule; the calling process moves into the run's client namespace."""
    reason = can_build()
    if reason:
        raise RuntimeError(reason)
    node_ids = ("a", "b", "c")
    faults = plan(seed, duration, node_ids, nemeses) if nemeses else []
    network = Network([*node_ids, "client"]).build()
    report = Report(workload, nemeses, seed, duration, faults, {})
    try:
        enter(f"/run/netns/{network.ns('client')}")
        nodes = MeshNodes(network, node_ids, fsync)
        try:
            nodes.start()
            report.verdicts = asyncio.run(WORKLOADS[workload](nodes, faults, duration, report.log))
        finally:
            nodes.stop()
    finally:
        network.teardown()
    return report


def print_report(report: Report) -> None:
    print(
        f"{report.workload} under {'+'.join(report.nemeses) or 'no faults'}, seed {report.seed}:",
        file=sys.stderr,
    )
    for line in report.log:
        print("  " + line, file=sys.stderr)
    for queue, verdict in report.verdicts.items():
        print(f"  {queue}: {verdict}", file=sys.stderr)


__all__ = ["NEMESES", "WORKLOADS", "Report", "print_report", "run"]
