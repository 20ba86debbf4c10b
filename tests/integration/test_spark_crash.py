"""Exactly once through a crash: a Spark driver copying one topic to another is SIGKILLed mid-stream
and started again on its checkpoint; the copy holds every event once. On both storage backends, as
two queries of one driver (one JVM per start, not one per backend): one kill takes both mid-stream."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.helpers import wait_until
from tests.spark_support import publish, run, stored_values

pytestmark = pytest.mark.spark_jvm

EVENTS = 3000
PER_BATCH = 300  # 10 batches: the slower backend's first copy comes long before the faster one's last
BACKENDS = ("local", "jetstream")


@dataclass
class Copy:
    """One backend's copy: its server and checkpoint, and what the test saw of it."""

    server: StreamsServerProcess
    checkpoint: Path
    partial: list[int] = field(default_factory=list)  # visible when the driver was killed
    taken_back: int | None = None  # the commit forgotten to make the restart replay a batch
    skipped_before: float = 0.0
    copied: list[int] = field(default_factory=list)
    skipped_after: float = 0.0

    def spec(self) -> list[str]:
        return [self.server.url, "copy-in", "copy-out", str(self.checkpoint), str(PER_BATCH)]


def _duplicates_skipped(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    found = re.search(r"^meshplane_streams_duplicates_skipped(?:_total)? (\S+)$", metrics, re.MULTILINE)
    assert found is not None, "no duplicates_skipped metric"
    return float(found.group(1))


def _driver(copies: list[Copy], log: Path) -> subprocess.Popen[bytes]:
    specs = [arg for copy in copies for arg in ("+", *copy.spec())][1:]
    argv = [sys.executable, "-m", "tests.spark_copy_driver", *specs]
    return subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def _take_back_the_last_commit(checkpoint: Path) -> int | None:
    """A kill after the sink committed a batch and before Spark's commit log says so, made certain:
    the restarted driver runs that batch again, and its commit appends nothing. (A batch the kill
    interrupted had made nothing visible: its staged rows are never committed.) With no commit yet,
    the kill came after the first batch's sink commit (events were copied) and before Spark logged it.
    Returns the batch taken back, if any."""
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda f: int(f.name))
    if not commits:
        return None
    last = int(commits[-1].name)  # the last commit taken back, and the batch planned after it forgotten
    for log_dir, batch in [("commits", last)] + [
        ("offsets", int(f.name)) for f in (checkpoint / "offsets").glob("[0-9]*") if int(f.name) > last
    ]:
        (checkpoint / log_dir / str(batch)).unlink()
        (checkpoint / log_dir / f".{batch}.crc").unlink(missing_ok=True)
    return last


def _kill(driver: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's Python and JVM: no clean stop, whatever they did
    driver.wait(30)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Copy]]:
    """Both backends' copies through one driver, SIGKILLed once both have copied some events, then
    started again on the checkpoints (each with its last commit taken back) until both are done."""
    root = tmp_path_factory.mktemp("spark-crash")
    with contextlib.ExitStack() as stack:
        nats = stack.enter_context(NatsServer(jetstream=True)).start()
        on_jetstream = StreamsServerProcess(extra_args=("--storage", nats.url))
        servers = {
            "local": stack.enter_context(StreamsServerProcess()).start(),
            "jetstream": stack.enter_context(on_jetstream).start(),
        }
        copies = {name: Copy(server, root / f"checkpoint-{name}") for name, server in servers.items()}
        for copy in copies.values():
            run(publish(copy.server.url, "copy-in", 0, EVENTS, partitions=2))
            run(_create_out(copy.server.url))
        log = root / "driver.log"
        driver = _driver(list(copies.values()), log)
        try:
            wait_until(
                lambda: all(stored_values(c.server.url, "copy-out") for c in copies.values()),
                timeout=240,  # a JVM's start (on a loaded machine, minutes), then a batch of each
                interval=0.05,
                what="copied events on both backends",
            )
            _kill(driver)
            for copy in copies.values():
                copy.partial = stored_values(copy.server.url, "copy-out")
                copy.taken_back = _take_back_the_last_commit(copy.checkpoint)
                copy.skipped_before = _duplicates_skipped(copy.server.url)
            driver = _driver(list(copies.values()), log)
            wait_until(
                lambda: all(len(stored_values(c.server.url, "copy-out")) >= EVENTS for c in copies.values()),
                timeout=240,  # a JVM's start, then both copies' batches on local[2]
                interval=0.5,  # each look reads both copies whole
                what="every event copied on both backends",
            )
        finally:
            _kill(driver)
        for copy in copies.values():
            copy.copied = stored_values(copy.server.url, "copy-out")
            copy.skipped_after = _duplicates_skipped(copy.server.url)
        yield copies


async def _create_out(url: str) -> None:
    async with StreamsClient(url) as client:
        await client.create_topic("copy-out", 2)


@pytest.mark.timeout(560)  # the fixture's waits add up to 540 s
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_driver_killed_mid_stream_resumes_on_its_checkpoint_and_copies_every_event_once(
    crashed: dict[str, Copy], backend: str
) -> None:
    copy = crashed[backend]
    assert 0 < len(copy.partial) < EVENTS, f"killed at {len(copy.partial)} copied: too late"
    assert sorted(copy.copied) == list(range(EVENTS))  # every event, none twice
    # the replayed batch, not stored again
    assert copy.skipped_after > copy.skipped_before, f"batch {copy.taken_back} taken back"
