"""Issue 53's two reproductions as scripted schedules (no random faults: the steps that lost or
doubled acknowledged events, in order), checked as the other workloads are.

- **mates-race**: the mesh-mates machines. The standby is restarted; as it logs "following the
  active", etcd is paused (SIGSTOP), so the active's write naming the standby in ``current`` hangs;
  the standby is SIGKILLed 0.45 s later and etcd resumed 0.55 s after that. Publishing goes on; 5 s
  later the active is killed and the standby restarted, then (5 s on) the old active. Before the fix
  the active acknowledged alone while etcd named the gone standby, which then took over without
  those events (1,518 of 2,514 lost).
- **mesh-resend**: mesh nodes a and c on hosts of their own. 5,000 guaranteed events through c for
  queue qa on a, then 55,000 published on a itself (more than the 50,000 ids a queue recalled on
  start, every way mixed); a is killed, c powered off (what its disk had not fsynced gone: its
  confirmed offset), both restarted: c sends its spool again. Before the fix qa held 5,000 twice.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable

import aiohttp

from meshplane.errors import TransportError
from meshplane.mesh.client import MeshClient
from tests.chaos import mates_workload
from tests.chaos.checker import Op, Verdict, check_queues
from tests.chaos.harness import ROUTE_PORT, Servers, Workload, streams_server
from tests.chaos.mesh_workload import body, collect, mesh_state, put_queue
from tests.chaos.schedule import Fault

FOLLOWING = "following the active"


async def race(servers: Servers, faults: list[Fault], duration: float, log: list[str]) -> dict[str, Verdict]:
    """The scripted race, publishing throughout and for ``AFTER_RACE`` seconds after its last step
    (the old active back as the standby, mirroring); ``duration`` is not used."""
    active = await mates_workload.prepare(servers)
    standby = next(mate for mate in mates_workload.MATES if mate != active)
    history: list[Op] = []
    stop_at = [float("inf")]

    async def script() -> None:
        try:
            await race_steps(servers, active, standby, log)
        finally:  # the publishers stop whatever happened
            stop_at[0] = time.monotonic() + AFTER_RACE

    await asyncio.gather(script(), *mates_workload.publishers(servers, lambda: stop_at[0], history))
    return await mates_workload.check_every_vouched_mate(servers, history, log)


AFTER_RACE = 5.0


async def race_steps(servers: Servers, active: str, standby: str, log: list[str]) -> None:
    began = time.monotonic()

    def step(what: str) -> None:
        log.append(f"{time.monotonic() - began:6.1f}s {what}")

    mate, etcd = servers.servers[standby], servers.servers["etcd"]
    await asyncio.sleep(2)
    await asyncio.to_thread(mate.kill, signal.SIGKILL)
    await asyncio.to_thread(mate.start, 30)
    step(f"{standby} (the standby) restarted")
    deadline = time.monotonic() + 30
    while FOLLOWING not in mate.log_path.read_text():  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{standby} did not follow the active within 30s")
        await asyncio.sleep(0.005)
    etcd.kill(signal.SIGSTOP)
    step(f"{standby} follows: etcd paused")
    await asyncio.sleep(0.45)
    await asyncio.to_thread(mate.kill, signal.SIGKILL)
    step(f"{standby} killed")
    await asyncio.sleep(0.55)
    etcd.kill(signal.SIGCONT)
    step("etcd resumed")
    await asyncio.sleep(5)
    await asyncio.to_thread(servers.servers[active].kill, signal.SIGKILL)
    step(f"{active} (the active) killed")
    await asyncio.to_thread(mate.start, 30)
    step(f"{standby} restarted")
    await asyncio.sleep(5)
    await asyncio.to_thread(servers.servers[active].start, 30)
    step(f"{active} restarted")


NODES = ("a", "c")
FROM_C, ON_A = 5_000, 55_000


def node_args(servers: Servers, node: str) -> tuple[str, ...]:
    peer = next(other for other in NODES if other != node)
    ids = ("--node-id", node, "--cluster", "c1", "--route-port", str(ROUTE_PORT))
    return (*ids, "--heartbeat-interval", "0.2", "--routes", servers.route_url(peer))


async def publish_many(node_url: str, publisher: str, count: int, history: list[Op]) -> None:
    """``count`` guaranteed events, many in flight, each outcome recorded."""
    client = await MeshClient(node_url, timeout=60.0).connect()
    try:
        answers = [
            await client.publish_async(f"orders.{publisher}", body(publisher, seq)) for seq in range(count)
        ]
        for seq, answer in enumerate(answers):
            try:
                await answer
                history.append(Op(publisher, seq, "ok"))
            except TransportError:
                history.append(Op(publisher, seq, "unknown"))
    finally:
        await client.close()


async def spool_drained(http: aiohttp.ClientSession, servers: Servers, node: str) -> bool:
    state = await mesh_state(http, servers, node)
    return state is not None and all(s["pending"] == 0 for s in state["guaranteed"]["spools"])


async def wait_for(
    what: str, condition: Callable[[aiohttp.ClientSession], Awaitable[bool]], timeout: float
) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        deadline = time.monotonic() + timeout
        while not await condition(http):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout:.0f}s")
            await asyncio.sleep(0.2)


async def resend(
    servers: Servers, faults: list[Fault], duration: float, log: list[str]
) -> dict[str, Verdict]:
    async def knows_queue(http: aiohttp.ClientSession) -> bool:
        state = await mesh_state(http, servers, "c")
        return state is not None and "$G.orders.>" in state["patterns"]["peers"].get("a", [])

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await put_queue(http, servers.url("a"), "qa", ["orders.>"])
    await wait_for("c learning a's queue", knows_queue, 30)
    history: list[Op] = []
    await publish_many(servers.route_url("c"), "pc", FROM_C, history)
    await wait_for("c's spool confirmed", lambda http: spool_drained(http, servers, "c"), 60)
    log.append(f"{FROM_C} through c stored in qa")
    await publish_many(servers.route_url("a"), "pa", ON_A, history)
    log.append(f"{ON_A} published on a")
    await asyncio.to_thread(servers.servers["a"].kill, signal.SIGKILL)
    power_off = Fault(0.0, 0.0, "power", ("c",))
    await asyncio.to_thread(servers.apply, power_off)
    log.append("a killed, c powered off")
    await asyncio.to_thread(servers.servers["a"].start, 30)
    await asyncio.to_thread(servers.heal, power_off)
    log.append("both restarted")
    await wait_for("c's spool confirmed again", lambda http: spool_drained(http, servers, "c"), 120)
    held = await collect({"qa": servers.url("a")}, history, timeout=90, settle=3.0)
    return check_queues(history, held, lambda queue, publisher: True)


MATES_RACE = Workload(
    mates_workload.HOSTS, (), mates_workload.server, race, targets=mates_workload.MATES, waves=(("etcd",),)
)
MESH_RESEND = Workload(NODES, (), streams_server(node_args), resend)
