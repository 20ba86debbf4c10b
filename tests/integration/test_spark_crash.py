"""Exactly once through a crash: a Spark driver copying one topic to another is SIGKILLed mid-stream
and started again on its checkpoint; the copy holds every event once. On both storage backends."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.helpers import wait_until
from tests.spark_support import publish, run, stored_values

pytestmark = pytest.mark.spark_jvm

EVENTS = 3000


@pytest.fixture(params=["local", "jetstream"])
def server(request: pytest.FixtureRequest) -> Iterator[StreamsServerProcess]:
    with contextlib.ExitStack() as stack:
        args: tuple[str, ...] = ()
        if request.param == "jetstream":
            nats = stack.enter_context(NatsServer(jetstream=True)).start()
            args = ("--storage", nats.url)
        yield stack.enter_context(StreamsServerProcess(extra_args=args)).start()


def _duplicates_skipped(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    found = re.search(r"^meshplane_streams_duplicates_skipped(?:_total)? (\S+)$", metrics, re.MULTILINE)
    assert found is not None, "no duplicates_skipped metric"
    return float(found.group(1))


def _driver(url: str, checkpoint: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tests.spark_copy_driver", url, "copy-in", "copy-out", str(checkpoint)]
    return subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.timeout(400)
def test_a_driver_killed_mid_stream_resumes_on_its_checkpoint_and_copies_every_event_once(
    server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "copy-in", 0, EVENTS, partitions=2))

    async def create_out() -> None:
        async with StreamsClient(server.url) as client:
            await client.create_topic("copy-out", 2)

    run(create_out())
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    driver = _driver(server.url, checkpoint, log)
    try:
        wait_until(
            lambda: len(stored_values(server.url, "copy-out")) > 0,
            timeout=120,
            interval=0.05,
            what="copied events",
        )
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's Python and JVM: no clean stop, whatever they did
        driver.wait(30)
        partial = stored_values(server.url, "copy-out")
        assert 0 < len(partial) < EVENTS, "killed too late to prove anything"
        # A kill after the sink committed a batch and before Spark's commit log says so, made
        # certain: the restarted driver runs that batch again, and its commit appends nothing. (A
        # batch the kill interrupted had made nothing visible: its staged rows are never committed.)
        # With no commit yet, the kill came after the first batch's sink commit (events were copied)
        # and before Spark logged it.
        commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda f: int(f.name))
        if commits:  # the last commit taken back, and the batch planned after it forgotten
            last = int(commits[-1].name)
            for log_dir, batch in [("commits", last)] + [
                ("offsets", int(f.name))
                for f in (checkpoint / "offsets").glob("[0-9]*")
                if int(f.name) > last
            ]:
                (checkpoint / log_dir / str(batch)).unlink()
                (checkpoint / log_dir / f".{batch}.crc").unlink(missing_ok=True)
        skipped_before = _duplicates_skipped(server.url)
        driver = _driver(server.url, checkpoint, log)
        wait_until(
            lambda: len(stored_values(server.url, "copy-out")) >= EVENTS,
            timeout=120,
            interval=0.2,
            what="copied events",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    copied = stored_values(server.url, "copy-out")
    assert sorted(copied) == list(range(EVENTS))  # every event, none twice
    assert _duplicates_skipped(server.url) > skipped_before  # the replayed batch, not stored again
