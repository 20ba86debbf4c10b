"""Exactly once on a Spark standalone cluster (a master and two workers of one core each, started
from pyspark's own classes on loopback and stopped by PID): a query with a shuffle writes through the
meshplane sink on a checkpoint; its driver is SIGKILLed mid-batch three times and started again on
the same checkpoint. Every row lands once, though the replayed tasks receive their rows in another
order than the first run's (shuffle blocks arrive from two executors as they come)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from meshplane.launchers import StreamsServerProcess
from meshplane.launchers.base import free_port
from meshplane.streams.client import StreamsClient
from tests.helpers import wait_until
from tests.spark_support import publish, run

ROWS, PER_BATCH = 18_000, 6_000  # 3 batches; each task stages ~3,000 rows in 1,000-row chunks
SPARK_CLASS = Path(pyspark.__file__).with_name("bin") / "spark-class"


def _spark_process(log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    argv = [str(SPARK_CLASS), *args]
    return subprocess.Popen(
        argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the JVM and what it started
    process.wait(30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes = [
        _spark_process(
            logs / "master.log",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
        )
    ]
    try:
        wait_until(
            lambda: "I have been elected leader" in (logs / "master.log").read_text(),
            timeout=120,
            interval=0.2,
            what="the master",
        )
        for n in range(2):
            processes.append(
                _spark_process(
                    logs / f"worker{n}.log",
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                    *("--webui-port", str(free_port()), "--work-dir", str(logs / f"work{n}"), master_url),
                )
            )
        wait_until(
            lambda: all("registered with master" in (logs / f"worker{n}.log").read_text() for n in range(2)),
            timeout=120,
            interval=0.2,
            what="two workers",
        )
        yield master_url
    finally:
        for process in reversed(processes):
            _stop(process)


def _copied(url: str) -> list[int]:
    async def read_all() -> list[int]:
        values: list[int] = []
        async with StreamsClient(url) as client:
            for partition in range(2):
                offset = 0
                while True:
                    batch = await client.consume_partition("cout", partition, offset, 1000)
                    if not batch["events"]:
                        break
                    values += [json.loads(e["data"])["i"] for e in batch["events"]]
                    offset = batch["events"][-1]["offset"] + 1
        return values

    result: list[int] = run(read_all())
    return result


def _driver(master: str, url: str, checkpoint: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "tests.spark_cluster_driver",
        url,
        "cin",
        "cout",
        str(checkpoint),
        str(PER_BATCH),
    ]
    env = dict(os.environ, MESHPLANE_SPARK_MASTER=master, SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.Popen(
        argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def _batch_running(checkpoint: Path) -> int | None:
    """The batch planned (in the offset log) and not committed, if any."""
    planned = (
        {int(f.name) for f in (checkpoint / "offsets").glob("[0-9]*")}
        if (checkpoint / "offsets").is_dir()
        else set()
    )
    done = (
        {int(f.name) for f in (checkpoint / "commits").glob("[0-9]*")}
        if (checkpoint / "commits").is_dir()
        else set()
    )
    running = planned - done
    return max(running) if running else None


@pytest.mark.timeout(900)
def test_a_driver_killed_mid_batch_on_a_cluster_with_a_shuffle_writes_every_row_once(
    cluster: str, tmp_path: Path
) -> None:
    with StreamsServerProcess() as server:
        server.start()
        run(publish(server.url, "cin", 0, ROWS, partitions=2))

        async def create_out() -> None:
            async with StreamsClient(server.url) as client:
                await client.create_topic("cout", 2)

        run(create_out())
        checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
        kills = []
        driver = _driver(cluster, server.url, checkpoint, log)
        try:
            for started, delay in enumerate((1.5, 2.5, 3.5), 1):  # into the batch: its tasks are writing

                def running(started: int = started) -> bool:
                    return (
                        log.read_text().count("started") >= started and _batch_running(checkpoint) is not None
                    )

                wait_until(
                    running,
                    timeout=300,
                    interval=0.05,
                    what="a batch",
                )
                batch = _batch_running(checkpoint)
                time.sleep(delay)  # a kill at a point of the batch, not a wait for a condition
                if _batch_running(checkpoint) != batch:
                    continue  # done already: that kill proves nothing
                driver.kill()  # SIGKILL, mid-batch
                driver.wait(30)
                kills.append((batch, len(_copied(server.url))))
                driver = _driver(cluster, server.url, checkpoint, log)
            assert len(kills) >= 2, f"too few kills landed mid-batch: {kills}"
            wait_until(
                lambda: (
                    len(_copied(server.url)) >= ROWS
                    and _batch_running(checkpoint) is None
                    and len(list((checkpoint / "commits").glob("[0-9]*"))) >= ROWS // PER_BATCH
                ),
                timeout=400,
                interval=0.5,
                what="every row copied",
            )
        finally:
            _stop(driver)
        copied = _copied(server.url)
        duplicated = len(copied) - len(set(copied))
        missing = ROWS - len(set(copied) & set(range(ROWS)))
        assert (len(copied), duplicated, missing) == (ROWS, 0, 0), f"kills (batch, rows out): {kills}"
