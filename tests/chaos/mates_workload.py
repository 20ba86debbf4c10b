"""HA mates on separate machines (issue 36, item 2): node a as two mates, a1 and a2, each on its own
host with its own data directory, mirroring the active to the standby, the lease in etcd on a host
of its own; node b routed to both mates. Publisher p1 publishes through b (spooled for a's queue),
p2 through node a (its client names both mates). Queues on a and on b take ``orders.>``. Faults hit
the mates: paused (the lease runs out, the standby serves; the old active resumes and steps down),
killed, powered off, isolated, capped, their wall clocks stepped, and the mirror link between them
cut (the active drops its standby from etcd's ``current`` before it acknowledges alone). At the end
each queue is read whole from whichever mate is active."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from meshplane.launchers import StreamsServerProcess
from meshplane.launchers.base import ServerProcess, find_binary, wait_for_port
from tests.chaos.checker import Op, Verdict, check_queues
from tests.chaos.harness import HTTP_PORT, ROUTE_PORT, Server, Servers, Workload, run_schedule
from tests.chaos.mesh_workload import collect, mesh_state, publish_until, put_queue
from tests.chaos.schedule import NEMESES, Fault

MATES = ("a1", "a2")
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380


class EtcdHost(ServerProcess):
    """etcd on its host of the harness, its data on the host's disk (kept across restarts)."""

    def __init__(self, servers: Servers, host: str) -> None:
        super().__init__()
        self.address = servers.network.address(host)
        self.launcher = servers.network.exec_prefix(host)
        self.data = servers.mount(host) / "etcd"

    def start(self, timeout: float = 30.0) -> EtcdHost:
        client, peer = f"http://{self.address}:{ETCD_PORT}", f"http://{self.address}:{ETCD_PEER_PORT}"
        argv = [
            *self.launcher,
            *(find_binary("etcd"), "--name", "chaos", "--data-dir", str(self.data)),
            *("--listen-client-urls", client, "--advertise-client-urls", client),
            *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
            *("--initial-cluster", f"chaos={peer}", "--log-level", "warn"),
        ]
        wait_for_port(self.address, ETCD_PORT, self._spawn(argv), timeout, self.log_path)
        return self


class Mate(StreamsServerProcess):
    """A mate: started once it says whether it follows or serves (a standby does not serve HTTP)."""

    def start(self, timeout: float = 30.0, *, ready: bool = True) -> Mate:
        super().start(timeout, ready=False)
        deadline = time.monotonic() + timeout
        while "HA mate" not in self.log_path.read_text():
            if (self.proc is not None and self.proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"mate did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        return self


def server(servers: Servers, host: str, fsync: str) -> Server:
    if host == "etcd":
        return EtcdHost(servers, host)
    address = servers.network.address(host)
    common: tuple[str, ...] = ("--host", address, "--route-port", str(ROUTE_PORT))
    common += ("--heartbeat-interval", "0.2", "--cluster", "ha", "--fsync", fsync)
    if host == "b":
        routes = ",".join(servers.route_url(mate) for mate in MATES)
        return StreamsServerProcess(
            port=HTTP_PORT,
            data_dir=servers.mount(host) / "data",
            extra_args=(*common, "--node-id", "b", "--routes", routes),
            launcher=servers.network.exec_prefix(host),
        )
    etcd = f"http://{servers.network.address('etcd')}:{ETCD_PORT}"
    return Mate(
        port=HTTP_PORT,
        data_dir=servers.mount(host) / "data",
        extra_args=(*common, "--node-id", "a", "--routes", servers.route_url("b"), "--mates-etcd", etcd),
        env=servers.clock_env(host),  # the clock nemesis steps a mate's wall clock
        launcher=servers.network.exec_prefix(host),
    )


async def active_mate(http: aiohttp.ClientSession, servers: Servers, timeout: float) -> str:
    """The mate that serves (the standby does not), within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        for mate in MATES:
            state = await mesh_state(http, servers, mate)
            if state is not None and state["mate"] is not None:
                return mate
        if time.monotonic() > deadline:
            raise TimeoutError(f"no mate of node a served within {timeout:.0f}s")
        await asyncio.sleep(0.2)


async def ready(http: aiohttp.ClientSession, servers: Servers, active: str) -> bool:
    """b and the active mate linked and knowing each other's queue, the standby in sync."""
    a, b = await mesh_state(http, servers, active), await mesh_state(http, servers, "b")
    if a is None or b is None or a["mate"]["state"] != "in_sync":
        return False
    for state, peer in ((a, "b"), (b, "a")):
        if "$G.orders.>" not in state["patterns"]["peers"].get(peer, []):
            return False
    return True


async def prepare(servers: Servers) -> str:
    """Queues on a and b, once the mates and b are linked and the standby mirrors: the active mate."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        active = await active_mate(http, servers, 30)
        await put_queue(http, servers.url(active), "qa", ["orders.>"])
        await put_queue(http, servers.url("b"), "qb", ["orders.>"])
        deadline = time.monotonic() + 30
        while not await ready(http, servers, active):
            if time.monotonic() > deadline:
                raise TimeoutError("the mates and b did not link, learn the queues and mirror within 30s")
            await asyncio.sleep(0.1)
    return active


def publishers(
    servers: Servers, stop_at: float | Callable[[], float], history: list[Op]
) -> list[Coroutine[Any, Any, None]]:
    """p1 through b (spooled for a's queue), p2 through node a (its client names both mates)."""
    both_mates = ",".join(servers.route_url(mate) for mate in MATES)
    return [
        publish_until(servers.route_url("b"), "p1", stop_at, history),
        publish_until(both_mates, "p2", stop_at, history),
    ]


async def run(servers: Servers, faults: list[Fault], duration: float, log: list[str]) -> dict[str, Verdict]:
    await prepare(servers)
    history: list[Op] = []
    stop_at = time.monotonic() + duration
    await asyncio.gather(run_schedule(servers, faults, log), *publishers(servers, stop_at, history))
    return await check_every_vouched_mate(servers, history, log)


async def check_every_vouched_mate(servers: Servers, history: list[Op], log: list[str]) -> dict[str, Verdict]:
    """b's queue and a's, read from the active mate and from the standby etcd's ``current`` names
    (made the active: a standby serves no HTTP), each read settled."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        active = await active_mate(http, servers, 60)
    log.append(f"published {len(history)}; {active} is active; collecting")
    queues = {f"qa@{active}": servers.url(active), "qb": servers.url("b")}
    held = await collect(queues, history, timeout=90, settle=SETTLE, topic_of=topic_of)
    view = await vouched(servers)
    log.append(f"etcd's current: {view}")
    standby = next(mate for mate in MATES if mate != active)
    if token(servers, standby) in view:
        await asyncio.to_thread(servers.servers[active].kill, signal.SIGKILL)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            now = await active_mate(http, servers, 60)
        log.append(f"{active} killed: {now} serves; collecting its copy")
        mine = {f"qa@{now}": servers.url(now)}
        held |= await collect(mine, history, timeout=90, settle=SETTLE, topic_of=topic_of)
    return check_queues(history, held, lambda queue, publisher: True)


SETTLE = 3.0  # seconds between the two reads that must be the same


def token(servers: Servers, mate: str) -> str:
    """The mate's name in etcd's ``current`` (kept with its data directory)."""
    return (servers.mount(mate) / "data" / ".mate-id").read_text().strip()


def topic_of(queue: str) -> str:
    return queue.split("@")[0]


async def vouched(servers: Servers) -> list[str]:
    """The mate tokens etcd's ``current`` names for node a."""
    from meshplane.mesh.lease import MateLease

    lease = MateLease((f"http://{servers.network.address('etcd')}:{ETCD_PORT}",), "ha", "a", "checker")
    try:
        tokens, _ = await lease.current()
        return tokens or []
    finally:
        await lease.close()


HOSTS = ("etcd", *MATES, "b")
# The faults fall on the mates and on etcd: etcd paused, killed or powered off, a mate cut off from
# etcd only (a partial partition: it still reaches b and its mate), one way or both; a mate's wall
# clock stepped (etcd's is Go's, out of the clock file's reach).
WORKLOAD = Workload(
    HOSTS, (*NEMESES, "clock"), server, run, targets=(*MATES, "etcd"), waves=(("etcd",),), clocked=MATES
)
