"""The short schedules of the fault harness, inside the suite: real servers in network namespaces
(their data on the power-loss filesystem), every nemesis a workload takes at least once, nothing
acknowledged lost, doubled, moved or reordered. CI replays one seed; a developer's run draws one
(printed, so a failure replays with ``python -m tests.chaos --workload W --seed N``).

The runs mostly wait (on a fault's length, a restart, a final read), so the module starts the
selected ones at its first test, ``PARALLEL`` at a time in the list's order (a Spark run, four
JVMs, alone), and each test waits for its own run's report."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.chaos.harness import workloads
from tests.chaos.network import can_build

# CI sets MESHPLANE_REQUIRE_CHAOS=1: there a machine that cannot build namespaces fails the run, not skips it.
REQUIRED = os.environ.get("MESHPLANE_REQUIRE_CHAOS") == "1"
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(bool(can_build()) and not REQUIRED, reason=can_build() or ""),
]

SEED = 36 if os.environ.get("CI") else random.randrange(1 << 31)
PARALLEL = int(os.environ.get("MESHPLANE_CHAOS_PARALLEL", "2"))  # runs at once (1: one after another)
STAGGER = 5.0  # seconds between two starts: one run's namespaces and boot not on top of another's
RUN_LIMIT, CLEANUP = 280.0, 60.0  # a run's seconds, then SIGTERM and this long to clean up


# workload, seconds, at least this many acknowledged (published, for direct events); the runs that
# go alone first, then the others two at a time, the longest first
SHORT_RUNS = [
    ("spark-jetstream", 30, 1000),  # the source a topic on JetStream R3
    ("spark-queue", 30, 1000),  # the source a mesh queue's topic
    ("spark-cluster", 30, 1000),
    ("topics-local", 40, 1000),  # 909-2,191 acknowledged alone on a loaded machine
    ("topics-jetstream", 35, 1000),
    ("groups", 25, 50),  # acknowledged commits: ~190 here, 91 in a loaded CI run (restarts take longer)
    ("mesh-mates", 45, 1000),  # HA mates on separate hosts, the lease in etcd
    ("mesh-direct", 45, 100_000),  # published, not acknowledged: direct events are at most once
    ("mesh-gateways", 45, 1000),
    ("mesh-guaranteed", 45, 1000),
    ("mates-race", 40, 1000),  # issue 53: the scripted race (a standby gone while etcd writes it in)
    ("groups-jetstream-clock", 30, 100),
    ("mesh-resend", 10, 59_000),  # issue 53: a whole spool resent after 55,000 from another source
]
# Alone: a Spark run (four JVMs: beside it a light run acknowledged half as much) and the runs whose
# floor is thin even alone (beside another, each fell under it on a loaded machine).
ALONE = {"spark-jetstream", "spark-queue", "spark-cluster", "topics-local", "topics-jetstream", "groups"}


@dataclass
class ShortRun:
    """One run's subprocess and, once ``done``, what it printed."""

    workload: str
    duration: int
    output: str = ""
    errors: str = ""
    returncode: int | None = None
    started: float = 0.0  # monotonic
    ended: float = 0.0
    proc: subprocess.Popen[str] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def alone(self) -> bool:
        return self.workload in ALONE

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "tests.chaos", "--one", "--workload", self.workload, "--seed", str(SEED)),
            *("--duration", str(self.duration), "--short", "--fsync", "always", "--nemesis", "all"),
        ]

    def run(self) -> None:
        """The run in a process of its own (it moves into its namespaces); stopped with SIGTERM if it
        overruns, so that it still heals, stops its servers and removes its namespaces."""
        state = tempfile.mkdtemp(prefix="meshplane-chaos-state-")  # its nodes' discovery records, apart
        try:
            env = {**os.environ, "XDG_STATE_HOME": state}
            self.proc = run = subprocess.Popen(
                self.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            try:
                self.output, self.errors = run.communicate(timeout=RUN_LIMIT)
            except subprocess.TimeoutExpired:
                run.terminate()
                try:
                    self.output, self.errors = run.communicate(timeout=CLEANUP)
                except subprocess.TimeoutExpired:
                    run.kill()
                    self.output, self.errors = run.communicate()
            self.returncode = run.returncode
        except BaseException as exc:
            self.errors += f"\nthe run could not go on: {exc!r}"
            raise
        finally:
            shutil.rmtree(state, ignore_errors=True)
            self.ended = time.monotonic()
            self.done.set()


class Pool:
    """Starts ``runs`` in their order, ``parallel`` at a time and ``STAGGER`` apart, those in ``ALONE``
    alone. A test (every earlier run done) finds its run started, or waits at most for one more."""

    def __init__(self, runs: list[ShortRun], parallel: int):
        self.runs, self.parallel = runs, max(1, parallel)
        self.changed = threading.Condition()
        self.stopping = False
        self.launcher = threading.Thread(target=self._launch, name="chaos-pool", daemon=True)
        self.threads: list[threading.Thread] = []

    def running(self) -> list[ShortRun]:
        return [run for run in self.runs if run.started and not run.done.is_set()]

    def _next(self) -> ShortRun | None:
        """The next run in order if it may start now (None: not yet, none left, or stopping)."""
        busy = self.running()
        run = next((run for run in self.runs if not run.started), None)
        if self.stopping or run is None or any(other.alone for other in busy):
            return None
        return run if len(busy) < (1 if run.alone else self.parallel) else None

    def _launch(self) -> None:
        last = 0.0
        for _ in self.runs:
            with self.changed:
                self.changed.wait_for(
                    lambda: self.stopping, timeout=max(0.0, last + STAGGER - time.monotonic())
                )
                self.changed.wait_for(lambda: self.stopping or self._next() is not None)
                run = self._next()
                if run is None:
                    return
                run.started = last = time.monotonic()
            name = f"chaos-{run.workload}"
            thread = threading.Thread(target=self._run, args=(run,), name=name, daemon=True)
            self.threads.append(thread)
            thread.start()

    def _run(self, run: ShortRun) -> None:
        try:
            run.run()
        finally:
            with self.changed:
                self.changed.notify_all()

    def stop(self) -> None:
        """Start no more; SIGTERM the runs still going (each cleans up after itself), wait for them."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        self.launcher.join(10)
        for run in self.running():
            if run.proc is not None:
                run.proc.terminate()
        for thread in self.threads:
            thread.join(CLEANUP + 10)


@pytest.fixture(scope="module")
def short_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, ShortRun]]:
    """The runs this session selected (``-k`` one: only that one), started in the background."""
    test = test_nothing_acknowledged_is_lost_under_every_nemesis
    selected = {
        item.callspec.params["workload"]
        for item in request.session.items
        if getattr(item, "function", None) is test and hasattr(item, "callspec")
    }
    runs = [ShortRun(name, duration) for name, duration, _ in SHORT_RUNS if name in selected]
    pool = Pool(runs, PARALLEL)
    if not can_build():
        pool.launcher.start()
    try:
        yield {run.workload: run for run in runs}
    finally:
        pool.stop()


# At worst the run started beside this one ends first (a run going alone waits for it: its 280 s, and
# 60 s to clean up if it overran), then this run's (each STAGGER after the last start).
@pytest.mark.timeout(720)
@pytest.mark.parametrize(("workload", "duration", "at_least"), SHORT_RUNS)
def test_nothing_acknowledged_is_lost_under_every_nemesis(
    workload: str, duration: int, at_least: int, short_runs: dict[str, ShortRun]
) -> None:
    assert not can_build(), f"MESHPLANE_REQUIRE_CHAOS=1: {can_build()}"
    run = short_runs[workload]
    waited = time.monotonic()
    assert run.done.wait(timeout=2 * (STAGGER + RUN_LIMIT + CLEANUP) + 10), f"{workload} did not end"
    here = max(0.0, run.ended - waited)
    print(f"{workload}: ran {run.ended - run.started:.1f} s, waited for here {here:.1f} s")
    print(run.errors)  # the schedule as applied, what showed each fault acting, and the verdicts
    lines = run.output.strip().splitlines()
    assert lines, f"the run failed (exit {run.returncode}): {run.errors[-3000:]}"
    report = json.loads(lines[-1])
    assert {fault["kind"] for fault in report["faults"]} == set(workloads()[workload].nemeses), f"seed {SEED}"
    assert report["unproven"] == [], f"seed {SEED}: faults that left no evidence of acting"
    assert len(report["evidence"]) == len(report["faults"]), report["evidence"]
    total = report["total"]
    at_most_once = workloads()[workload].at_most_once
    assert total["operations" if at_most_once else "acknowledged"] > at_least, total
    checked: tuple[str, ...] = ("lost", "unreadable", "duplicated", "reordered", "unexpected", "moved")
    checked += () if at_most_once else ("gaps",)
    wrong = {name: total[name] for name in checked}
    assert wrong == dict.fromkeys(wrong, 0), f"seed {SEED}: {total}"
    assert run.returncode == 0


def test_a_cut_drops_packets_so_a_connect_hangs_as_on_a_real_partition() -> None:
    """Issue 53: a blackhole route failed a connect at once (EINVAL). Now the packets are lost on
    the way: a connect across a cut hangs until its timeout; healed, it is answered at once."""
    from tests.chaos.network import Network

    network = Network(["a", "b"]).build()
    try:

        def connect() -> str:
            probe = (
                "import socket\n"
                "try:\n"
                f"    socket.create_connection(({network.address('b')!r}, 9), timeout=2)\n"
                "except OSError as exc:\n"
                "    print(type(exc).__name__)\n"
            )
            command = [*network.exec_prefix("a"), sys.executable, "-c", probe]
            return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()

        assert connect() == "ConnectionRefusedError"  # b answers: nothing listens on port 9
        network.drop("a", "b")
        assert connect() in ("TimeoutError", "timeout")
        network.undrop("a", "b")
        assert connect() == "ConnectionRefusedError"
    finally:
        network.teardown()
