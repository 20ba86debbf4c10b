"""HA mates on separate machines (issue 36, item 2): node a as two processes, each with its own data
directory, the active mirroring to the standby, the lease in a real etcd. The active is paused
(SIGSTOP keeps its sockets open, as a hung or cut-off machine does), killed or resumed while node b
publishes guaranteed events for a queue on a."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshplane.launchers import StreamsServerProcess, free_port
from meshplane.launchers.etcd import EtcdServer
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.cli import run_cli
from tests.support.mesh import interest_reached, put_queue, queue_bodies, status

LEASE_TTL = 3.0  # seconds: meshplane.mesh.lease's default


class Mates:
    """a1 and a2 (mates of node a, own data directories, fixed ports) and b, routed to both."""

    def __init__(self, tmp_path: Path, etcd: EtcdServer) -> None:
        self.cluster = f"m{os.urandom(4).hex()}"  # one etcd for the session: keys of their own
        a_ports = [(free_port(), free_port()) for _ in range(2)]
        b_port = free_port()
        common = ("--cluster", self.cluster, "--heartbeat-interval", "0.2", "--node-id")
        self.routes = ",".join(f"tcp://127.0.0.1:{route}" for _, route in a_ports)
        self.mates = [
            StreamsServerProcess(
                port=http,
                data_dir=tmp_path / f"a{i + 1}",
                extra_args=(
                    *common,
                    "a",
                    "--route-port",
                    str(route),
                    "--routes",
                    f"tcp://127.0.0.1:{b_port}",
                    "--mates-etcd",
                    etcd.endpoint,
                ),
            )
            for i, (http, route) in enumerate(a_ports)
        ]
        self.b = StreamsServerProcess(
            extra_args=(*common, "b", "--route-port", str(b_port), "--routes", self.routes)
        )

    def __enter__(self) -> Mates:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        for name, process in (("a1", self.mates[0]), ("a2", self.mates[1]), ("b", self.b)):
            if process.proc is not None and process.proc.poll() is None:
                os.kill(process.proc.pid, signal.SIGCONT)
            if kind is not None and process.log_path.exists():  # what each said, for the failure
                print(f"--- {name}:\n{process.log_path.read_text()[-6000:]}")
            process.cleanup()


async def mate_state(mate: StreamsServerProcess) -> dict[str, Any] | None:
    """The mate's ``GET /mesh`` ``mate`` section, or None while it does not serve (a standby)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
            http.get(f"http://127.0.0.1:{mate.port}/mesh") as response,
        ):
            answer: dict[str, Any] = (await response.json())["mate"]
            return answer
    except (aiohttp.ClientError, TimeoutError):
        return None


async def serving(mate: StreamsServerProcess) -> bool:
    return await mate_state(mate) is not None


async def in_sync(active: StreamsServerProcess) -> bool:
    state = await mate_state(active)
    return state is not None and state["state"] == "in_sync"


@contextlib.asynccontextmanager
async def steadily(client: MeshClient, subject: str) -> AsyncIterator[list[bytes]]:
    """Guaranteed events published one after the other until the block ends (those acknowledged),
    from the 300th on; the one in flight at the end is awaited, so the list is exactly what was."""
    acknowledged: list[bytes] = []
    stop = asyncio.Event()

    async def run() -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            body = f"{subject}-{i}".encode()
            await client.publish(subject, body, guaranteed=True)
            acknowledged.append(body)
            await asyncio.sleep(0.001)  # about 1,000 a second: every phase of the test sees some

    task = asyncio.create_task(run())
    await eventually(lambda: len(acknowledged) >= 300, what="publishing under way")
    try:
        yield acknowledged
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.fixture
def mates(tmp_path: Path, etcd_server: EtcdServer) -> Mates:
    return Mates(tmp_path, etcd_server)


@pytest.mark.timeout(240)
async def test_a_paused_active_is_replaced_by_its_standby_within_the_lease_and_a_start_and_nothing_is_lost(
    mates: Mates,
) -> None:
    """SIGSTOP the active while b publishes guaranteed events for a's queue: the standby serves within
    the lease's 3 s and a mate's start-up (as measured here: under 6 s on an idle machine) with every
    acknowledged event; the old active, resumed, steps down and mirrors the new one; then the new
    active is killed and the old one takes over again with everything."""
    a1, a2 = mates.mates
    with mates:
        spawned = time.monotonic()
        a1.start()
        await eventually(lambda: serving(a1), what="a1 active")
        # A standby that waited for anything but the lease (a second TTL, a retry) takes seconds more.
        takeover_bound = LEASE_TTL + 1.5 * (time.monotonic() - spawned) + 1.0
        a2.start(ready=False)
        mates.b.start()
        await put_queue(a1, "ha", ["ha.>"])
        await interest_reached(mates.b, "a", "$G.ha.>")
        await eventually(lambda: in_sync(a1), timeout=20, what="a2 mirrors a1")

        publisher = await MeshClient(mates.b.route_url, timeout=30).connect()
        try:
            async with steadily(publisher, "ha.x") as acknowledged:
                a1.kill(signal.SIGSTOP)
                paused = time.monotonic()
                await asyncio.to_thread(a2.wait_ready, 20)
                took_over = time.monotonic() - paused
                assert took_over <= takeover_bound, f"the standby served after {took_over:.1f}s"
                before_resume = len(acknowledged)
                await eventually(lambda: len(acknowledged) > before_resume + 300, what="publishing via a2")
                a1.kill(signal.SIGCONT)  # the old active resumes: it must not acknowledge anything
                await eventually(lambda: in_sync(a2), timeout=30, what="a1 stepped down and mirrors a2")
                assert not await serving(a1)  # a standby does not serve
                a2.kill(signal.SIGKILL)
                killed = time.monotonic()
                await eventually(lambda: serving(a1), timeout=10, what="a1 active again")
                took_over = time.monotonic() - killed
                assert took_over <= takeover_bound, f"the old active served again after {took_over:.1f}s"
                await eventually(lambda: spool_drained(mates.b), timeout=30, what="b's spool confirmed by a1")
        finally:
            await publisher.close()

        async def complete() -> bool:
            return len(await queue_bodies(a1, "ha")) >= len(acknowledged)

        await eventually(complete, timeout=30, what="every acknowledged event in a1's queue")
        assert await queue_bodies(a1, "ha") == acknowledged  # once each, in order
        assert await spool_drained(mates.b)


async def spool_drained(node: StreamsServerProcess) -> bool:
    spools = (await status(node))["guaranteed"]["spools"]
    return all(spool["pending"] == 0 for spool in spools)


async def test_a_mate_connection_is_refused_by_a_node_without_mates(tmp_path: Path) -> None:
    """Only a node started with --mates-etcd feeds a standby (which proves the mesh secret as routes
    do): the refusal says why and is counted; nothing is written to the would-be standby's directory."""
    from meshplane.launchers import MeshCluster
    from meshplane.mesh.lease import ActiveMate, MateLease
    from meshplane.mesh.standby import Standby
    from meshplane.streams.mirror import DirectoryReplica

    with MeshCluster(1) as cluster:
        node = cluster.start()["a"]
        lease = MateLease(("127.0.0.1:1",), "default", "a", "t0")  # never reached: refused before
        standby = Standby(
            DirectoryReplica(tmp_path / "copy"),
            lease,
            node_id="a",
            cluster=node.announced["mesh"]["cluster"],
            secret="",
            tls=None,
            max_payload=1 << 20,
        )
        with pytest.raises(ConnectionError, match="no HA mate"):
            await standby._follow(ActiveMate("t1", node.route_url, 1), asyncio.Event())
        errors = (await status(node))["frame_errors"]
        assert errors["hello_mate"] == 1
        assert list((tmp_path / "copy").iterdir()) == []


async def mates_cli(etcd: EtcdServer, cluster: str, *argv: str) -> tuple[int, str]:
    """``meshplane mesh mates ...`` for node a: its exit code and what it printed (stdout, stderr)."""
    args = ("mesh", "mates", *argv, "--etcd", etcd.endpoint, "--cluster", cluster, "--node", "a")
    result = await asyncio.to_thread(run_cli, *args)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.timeout(240)
async def test_mates_whose_named_mates_are_gone_for_good_wait_until_an_operator_resets_current(
    mates: Mates, etcd_server: EtcdServer
) -> None:
    """Issue 53, item 4: both mates stopped and both data directories replaced (a redeploy): neither
    may take over (etcd names the old ones) and the standby's log names the way out; `meshplane mesh
    mates` shows etcd's view, `mates reset` refuses while a named mate runs, says what may be lost,
    and with --yes lets the first new mate take over."""
    a1, a2 = mates.mates
    with mates:
        a1.start()
        await eventually(lambda: serving(a1), what="a1 active")
        a2.start(ready=False)
        await eventually(lambda: in_sync(a1), timeout=20, what="a2 mirrors a1")
        tokens = [(mate.data_dir / ".mate-id").read_text().strip() for mate in (a1, a2)]
        code, out = await mates_cli(etcd_server, mates.cluster)
        view = json.loads(out)
        assert code == 0, out
        assert (view["active"], view["current"], view["alive"]) == (tokens[0], tokens, sorted(tokens))
        assert view["epoch"] > 0
        code, out = await mates_cli(etcd_server, mates.cluster, "reset", "--yes")
        assert code != 0
        assert f"mate {tokens[0]} is active" in out

        a2.kill(signal.SIGKILL)
        a1.kill(signal.SIGKILL)
        for mate in (a1, a2):
            mate.proc.wait()  # type: ignore[union-attr]
            shutil.rmtree(mate.data_dir)
            mate.start(ready=False)

        def waiting(mate: StreamsServerProcess) -> bool:
            return "meshplane mesh mates reset --etcd" in mate.log_path.read_text()

        await eventually(lambda: waiting(a1) and waiting(a2), timeout=30, what="both wait, naming reset")
        code, out = await mates_cli(etcd_server, mates.cluster, "reset")
        assert code != 0  # without --yes: says what it would lose (or that a named mate still runs)
        assert f"etcd's current names {tokens[0]}" in out or "still runs" in out  # (a2's drop, if seen)

        async def refused_until_gone() -> bool:  # the killed mates' presence lasts their lease's TTL
            code, out = await mates_cli(etcd_server, mates.cluster, "reset")
            return code != 0 and "is lost for good" in out and "Run again with --yes" in out

        await eventually(refused_until_gone, timeout=20, what="reset says what may be lost")
        assert not await serving(a1)
        assert not await serving(a2)
        code, out = await mates_cli(etcd_server, mates.cluster, "reset", "--yes")
        assert code == 0, out

        async def one_serves() -> bool:
            return await serving(a1) or await serving(a2)

        await eventually(one_serves, timeout=30, what="a new mate took over")
