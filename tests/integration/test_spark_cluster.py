"""Exactly once on a Spark standalone cluster (a master and two workers of one core each, started
from pyspark's own classes on loopback and stopped by PID): a query with a shuffle writes through the
meshplane sink on a checkpoint; its driver is SIGKILLed mid-batch three times and started again on
the same checkpoint. Every row lands once, though the replayed tasks receive their rows in another
order than the first run's (shuffle blocks arrive from two executors as they come)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pyspark
import pytest

from meshplane.launchers import StreamsServerProcess
from meshplane.launchers.base import free_port
from meshplane.streams.client import StreamsClient
from tests.helpers import wait_until
from tests.spark_support import run, stored_values

ROWS, PER_BATCH = 24_000, 8_000  # 3 batches; each task writes ~4,000 rows in 1,000-row chunks
SPARK_CLASS = Path(pyspark.__file__).with_name("bin") / "spark-class"

pytestmark = pytest.mark.spark_jvm  # a standalone master, two workers and a driver: four JVMs


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


class Cluster:
    """A master started at once; :meth:`ready` waits for it and starts the two workers. Between the
    two, the test publishes its rows: the master's JVM starts meanwhile."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        port = free_port()
        self.master = f"spark://127.0.0.1:{port}"
        self.processes = [
            _spark_process(
                logs / "master.log",
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
            )
        ]

    def ready(self) -> str:
        logs = self.logs
        wait_until(
            lambda: "I have been elected leader" in (logs / "master.log").read_text(),
            timeout=120,
            interval=0.2,
            what="the master",
        )
        for n in range(2):
            self.processes.append(
                _spark_process(
                    logs / f"worker{n}.log",
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                    *("--webui-port", str(free_port()), "--work-dir", str(logs / f"work{n}"), self.master),
                )
            )
        wait_until(
            lambda: all("registered with master" in (logs / f"worker{n}.log").read_text() for n in range(2)),
            timeout=120,
            interval=0.2,
            what="two workers",
        )
        return self.master


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield started
    finally:
        for process in reversed(started.processes):
            _stop(process)


def _driver(master: str, url: str, checkpoint: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tests.spark_copy_driver", url, "cin", "cout", str(checkpoint)]
    argv += [str(PER_BATCH), "shuffle"]
    env = dict(os.environ, MESHPLANE_SPARK_MASTER=master, SPARK_LOCAL_IP="127.0.0.1")
    if "SPARK_SUBMIT_OPTS" in env:  # the driver's JVM options (see conftest) for its executors too
        executors = f"spark.executor.extraJavaOptions={env['SPARK_SUBMIT_OPTS']}"
        env["PYSPARK_SUBMIT_ARGS"] = f"--conf {shlex.quote(executors)} pyspark-shell"
    return subprocess.Popen(
        argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def _writing(logs: Path, apps_before: set[str]) -> bool:
    """Whether an executor of the driver started last runs a task of a stage after the shuffle (the
    sink's stage, the second of a batch's two): its rows are being written."""
    apps = [a for a in logs.glob("work*/app-*") if a.name not in apps_before]
    return any(
        re.search(r"Running task \S+ in stage [1-9]", stderr.read_text(errors="replace"))
        for app in apps
        for stderr in app.glob("*/stderr")
    )


async def _publish(url: str) -> None:
    """Rows of ~1 KB: a task's rows do not fit in the socket buffers between its JVM and its Python
    worker, so a task whose executor dies stops part-way through them."""
    async with StreamsClient(url) as client:
        await client.create_topic("cin", 2)
        await client.create_topic("cout", 2)
        for first in range(0, ROWS, 500):
            events = [
                {"event_type": "row", "key": f"k{i % 13}", "data": {"i": i, "pad": "x" * 1000}}
                for i in range(first, first + 500)
            ]
            await client.publish_batch("cin", events)


def _committed(checkpoint: Path) -> int:
    return len(list((checkpoint / "commits").glob("[0-9]*"))) if (checkpoint / "commits").is_dir() else 0


@pytest.mark.timeout(1560)  # its waits add up to 1540 s (the cluster's start, 240 s, among them)
def test_a_driver_killed_mid_batch_on_a_cluster_with_a_shuffle_writes_every_row_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    with StreamsServerProcess() as server:
        server.start()
        run(_publish(server.url))
        master, logs = cluster.ready(), cluster.logs
        checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
        kills: list[tuple[int, int]] = []  # (batches committed, rows visible) at each kill
        for delay in (0.3, 0.8, 1.3):  # into the writing: the tasks are part-way through their rows
            apps_before = {a.name for a in logs.glob("work*/app-*")}
            driver = _driver(master, server.url, checkpoint, log)
            try:
                wait_until(
                    partial(_writing, logs, apps_before),
                    timeout=300,
                    interval=0.05,
                    what="a write",
                )
                time.sleep(delay)  # a kill at a point of the write, not a wait for a condition
            finally:
                _stop(driver)  # SIGKILL
            kills.append((_committed(checkpoint), len(stored_values(server.url, "cout"))))
        assert _committed(checkpoint) < ROWS // PER_BATCH, f"killed too late to prove anything: {kills}"
        driver = _driver(master, server.url, checkpoint, log)
        try:
            wait_until(
                lambda: _committed(checkpoint) >= ROWS // PER_BATCH,
                timeout=400,
                interval=0.5,
                what="every batch committed",
            )
        finally:
            _stop(driver)
        copied = stored_values(server.url, "cout")
        duplicated = len(copied) - len(set(copied))
        missing = ROWS - len(set(copied) & set(range(ROWS)))
        assert (len(copied), duplicated, missing) == (ROWS, 0, 0), (
            f"kills (batches committed, rows visible): {kills}"
        )
