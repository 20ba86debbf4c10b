"""A Spark query on a real cluster copying a topic exactly once while its machines fail: a standalone
Spark master (host m) and two workers (w1, w2: one core each), each in its own namespace; the streams
server on host a; the driver (``tests/spark_copy_driver.py``) on the client host. The faults fall on
the workers (a kill takes the worker and its executor, as a machine's death does). At the end the
copy must hold every acknowledged source event once, each source partition's in its order.

Three sources (issue 36, item 5):

- **spark-cluster**: a topic of two partitions on server a's local log; producers append to both
  throughout (idempotent batches);
- **spark-jetstream**: the same on JetStream: three nats-servers (n1-n3) and server a keeping its
  topics there with three replicas;
- **spark-queue**: a mesh queue's topic: server a is mesh node a holding queue ``spark-in``, a
  publisher on mesh node b publishes guaranteed events for it throughout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from meshplane.errors import TransportError
from meshplane.launchers.base import ServerProcess, wait_for_port
from meshplane.mesh.client import MeshClient
from tests.chaos.checker import Op, Outcome, Verdict, check_queues
from tests.chaos.harness import ROUTE_PORT, Server, Servers, Workload, run_schedule, streams_server
from tests.chaos.jetstream_workload import CLIENT_PORT, NATS, NatsHost
from tests.chaos.schedule import Fault

SOURCE, COPY = "spark-in", "spark-out"
# Source events a micro-batch: the producers append ~600 a second, so at the crash test's 300 the
# copy fell ever further behind and caught up for minutes after the traffic (a batch takes seconds
# on the loaded cluster, whatever its size); at 1,000 it keeps up, each fault still hitting batches
# in flight.
PER_BATCH = 1000
MASTER_PORT, WORKER_PORT = 7077, 7078


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


class SparkDaemon(ServerProcess):
    """A standalone master, or a worker of ``master``, on a host of the harness."""

    def __init__(self, servers: Servers, host: str, master: str | None) -> None:
        super().__init__()
        self.address = servers.network.address(host)
        self.launcher = servers.network.exec_prefix(host)
        self.master = master

    def start(self, timeout: float = 60.0) -> SparkDaemon:
        if self.master is None:
            role = ["org.apache.spark.deploy.master.Master", "--port", str(MASTER_PORT)]
            port = MASTER_PORT
        else:
            role = ["org.apache.spark.deploy.worker.Worker", "--port", str(WORKER_PORT), "--cores", "1"]
            role += ["--memory", "1g", f"spark://{self.master}:{MASTER_PORT}"]
            port = WORKER_PORT
        argv = [*self.launcher, spark_class(), *role, "--host", self.address, "--webui-port", "8081"]
        env = {**os.environ, "SPARK_LOCAL_IP": self.address, "SPARK_WORKER_DIR": str(self.workdir / "work")}
        wait_for_port(self.address, port, self._spawn(argv, env), timeout, self.log_path)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """The whole process group: a worker's executors die with it, as on a machine that dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait(10)

    def stop(self) -> None:
        self.kill(signal.SIGKILL)


def server(servers: Servers, host: str, fsync: str) -> Server:
    if host in NATS:
        return NatsHost(servers, host, fsync == "always")
    if host in ("a", "b"):
        return streams_server(server_args)(servers, host, fsync)
    return SparkDaemon(servers, host, None if host == "m" else servers.network.address("m"))


def server_args(servers: Servers, host: str) -> tuple[str, ...]:
    """Server a on JetStream when the run has nats-servers; a and b mesh nodes when it has b."""
    if "n1" in servers.hosts and host == "a":
        storage = ",".join(f"nats://{servers.network.address(n)}:{CLIENT_PORT}" for n in NATS)
        return ("--storage", storage, "--replicas", "3")
    if "b" in servers.hosts:
        peer = "b" if host == "a" else "a"
        ids = ("--node-id", host, "--cluster", "spark", "--route-port", str(ROUTE_PORT))
        return (*ids, "--heartbeat-interval", "0.2", "--routes", servers.route_url(peer))
    return ()


async def produce_until(http: aiohttp.ClientSession, url: str, stop_at: float, history: list[Op]) -> None:
    """Batches of 50 to each source partition in turn, each retried under its key until answered."""
    seqs = [0, 0]
    batch = 0
    while time.monotonic() < stop_at:
        partition = batch % 2
        publisher, first = f"part{partition}", seqs[partition]
        events = [{"event_type": "e", "data": {"p": publisher, "seq": first + i}} for i in range(50)]
        body = {"events": events, "partition": partition, "idempotency_key": f"batch-{batch}"}
        outcome: Outcome = "unknown"
        while time.monotonic() < stop_at + 30:
            try:
                async with http.post(f"{url}/topics/{SOURCE}/publish", json=body) as response:
                    if response.status == 200:
                        outcome = "ok"
                        break
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
        history.extend(Op(publisher, first + i, outcome) for i in range(50))
        seqs[partition] += 50
        batch += 1
        await asyncio.sleep(0.05)


async def read_copy(http: aiohttp.ClientSession, url: str) -> list[tuple[str, int]]:
    held: list[tuple[str, int]] = []
    offset = 0
    while True:
        request = {"from_offset": offset, "limit": 1000}
        async with http.post(f"{url}/topics/{COPY}/partitions/0/consume", json=request) as response:
            page: dict[str, Any] = await response.json()
        if not page["events"]:
            return held
        for event in page["events"]:
            data = event["data"]
            fields = json.loads(data) if isinstance(data, str) else data
            held.append((str(fields["p"]), int(fields["seq"])))
        offset = page["next_offset"]


async def publish_until(servers: Servers, stop_at: float, history: list[Op]) -> None:
    """Guaranteed events for a's queue from a client of node b, 50 in flight at a time."""
    client = await MeshClient(servers.route_url("b"), timeout=5.0).connect()
    seq = 0

    async def one(n: int) -> None:
        body = json.dumps({"p": "pub", "seq": n}).encode()
        try:
            await client.publish("spark.in", body, guaranteed=True)
            history.append(Op("pub", n, "ok"))
        except TransportError:
            history.append(Op("pub", n, "unknown"))

    try:
        while time.monotonic() < stop_at:
            await asyncio.gather(*(one(seq + i) for i in range(50)))
            seq += 50
            await asyncio.sleep(0.05)
    finally:
        await client.close()


async def queue_ready(http: aiohttp.ClientSession, servers: Servers) -> None:
    """Queue ``spark-in`` on a, and b knowing of it (so b spools for a from the first publish)."""
    async with http.put(f"{servers.url('a')}/mesh/queues/{SOURCE}", json={"patterns": ["spark.>"]}) as answer:
        assert answer.status == 200, await answer.text()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async with http.get(f"{servers.url('b')}/mesh", params={"patterns": "1"}) as response:
            state = await response.json()
        if "$G.spark.>" in state["patterns"]["peers"].get("a", []):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("node b did not learn a's queue within 30s")


def start_driver(servers: Servers, url: str) -> tuple[subprocess.Popen[bytes], Path]:
    """The copy's driver on the client host (this process's namespace), and its log."""
    checkpoint = Path(tempfile.mkdtemp(prefix="meshplane-chaos-spark-"))
    env = {
        **os.environ,
        "MESHPLANE_SPARK_MASTER": f"spark://{servers.network.address('m')}:{MASTER_PORT}",
        "SPARK_LOCAL_IP": servers.network.address("client"),
    }
    command = [sys.executable, "-m", "tests.spark_copy_driver", url, SOURCE, COPY, str(checkpoint / "cp")]
    command.append(str(PER_BATCH))
    with open(checkpoint / "driver.log", "wb") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT
        ), checkpoint / "driver.log"


def stop_driver(driver: subprocess.Popen[bytes]) -> None:
    driver.terminate()
    try:
        driver.wait(30)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait(10)


async def run(servers: Servers, faults: list[Fault], duration: float, log: list[str]) -> dict[str, Verdict]:
    url = servers.url("a")
    queue = "b" in servers.hosts
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        if queue:
            await queue_ready(http, servers)  # the queue's topic is the source
        for topic, partitions in ((COPY, 1),) if queue else ((SOURCE, 2), (COPY, 1)):
            async with http.post(f"{url}/topics/{topic}", json={"num_partitions": partitions}) as response:
                assert response.status == 201, await response.text()
        driver, driver_log = await asyncio.to_thread(start_driver, servers, url)
        try:
            history: list[Op] = []
            stop_at = time.monotonic() + duration
            producing = (
                publish_until(servers, stop_at, history)
                if queue
                else produce_until(http, url, stop_at, history)
            )
            await asyncio.gather(run_schedule(servers, faults, log), producing)
            acknowledged = {(op.publisher, op.seq) for op in history if op.outcome == "ok"}
            log.append(f"produced {len(history)}, waiting for the copy")
            deadline = time.monotonic() + 240
            while not acknowledged <= set(held := await read_copy(http, url)):
                if driver.poll() is not None or time.monotonic() > deadline:
                    tail = (await asyncio.to_thread(driver_log.read_text))[-1500:]
                    log.append(f"the copy stopped at {len(held)}: {tail}")
                    break
                await asyncio.sleep(1.0)
            await asyncio.sleep(3.0)  # a late duplicate would land now
            held = await read_copy(http, url)
        finally:
            await asyncio.to_thread(stop_driver, driver)
    return {COPY: check_queues(history, {COPY: held}, lambda queue, publisher: True)[COPY]}


SPARK = ("m", "w1", "w2")
WORKERS = ("w1", "w2")
NEMESES = ("kill", "pause", "isolate")
# The master before the workers (they register at start), the nats-servers before server a.
WORKLOAD = Workload(("a", *SPARK), NEMESES, server, run, targets=WORKERS, waves=(("m", "a"),))
ON_JETSTREAM = Workload((*NATS, "a", *SPARK), NEMESES, server, run, targets=WORKERS, waves=((*NATS, "m"),))
ON_QUEUE = Workload(("a", "b", *SPARK), NEMESES, server, run, targets=WORKERS, waves=(("m", "a", "b"),))
