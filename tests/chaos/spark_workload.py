"""A Spark query on a real cluster copying a topic exactly once while its machines fail: a standalone
Spark master (host m) and two workers (w1, w2: one core each), each in its own namespace; the streams
server on host a; the driver (``tests/spark_copy_driver.py``) on the client host. Producers append to
the source topic's two partitions throughout; the faults fall on the workers (a kill takes the
worker and its executor, as a machine's death does). At the end the copy must hold every
acknowledged source event once, each source partition's in its order."""

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

from meshplane.launchers.base import ServerProcess, wait_for_port
from tests.chaos.checker import Op, Outcome, Verdict, check_queues
from tests.chaos.harness import Server, Servers, Workload, run_schedule, streams_server
from tests.chaos.schedule import Fault

SOURCE, COPY = "spark-in", "spark-out"
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
    if host == "a":
        return streams_server(lambda s, h: ())(servers, host, fsync)
    return SparkDaemon(servers, host, None if host == "m" else servers.network.address("m"))


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


def start_driver(servers: Servers, url: str) -> tuple[subprocess.Popen[bytes], Path]:
    """The copy's driver on the client host (this process's namespace), and its log."""
    checkpoint = Path(tempfile.mkdtemp(prefix="meshplane-chaos-spark-"))
    env = {
        **os.environ,
        "MESHPLANE_SPARK_MASTER": f"spark://{servers.network.address('m')}:{MASTER_PORT}",
        "SPARK_LOCAL_IP": servers.network.address("client"),
    }
    command = [sys.executable, "-m", "tests.spark_copy_driver", url, SOURCE, COPY, str(checkpoint / "cp")]
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
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for topic, partitions in ((SOURCE, 2), (COPY, 1)):
            async with http.post(f"{url}/topics/{topic}", json={"num_partitions": partitions}) as response:
                assert response.status == 201, await response.text()
        driver, driver_log = await asyncio.to_thread(start_driver, servers, url)
        try:
            history: list[Op] = []
            stop_at = time.monotonic() + duration
            await asyncio.gather(
                run_schedule(servers, faults, log), produce_until(http, url, stop_at, history)
            )
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


WORKLOAD = Workload(("a", "m", "w1", "w2"), ("kill", "pause", "isolate"), server, run, targets=("w1", "w2"))
