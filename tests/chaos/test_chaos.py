"""The short schedules of the fault harness, inside the suite: real servers in network namespaces
(their data on the power-loss filesystem), every nemesis a workload takes at least once, nothing
acknowledged lost, doubled, moved or reordered. CI replays one seed; a developer's run draws one
(printed, so a failure replays with ``python -m tests.chaos --workload W --seed N``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

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


# workload, seconds, at least this many acknowledged (published, for direct events)
SHORT_RUNS = [
    ("mesh-guaranteed", 45, 1000),
    ("mesh-gateways", 45, 1000),
    ("mesh-direct", 45, 100_000),  # published, not acknowledged: direct events are at most once
    ("mesh-mates", 45, 1000),  # HA mates on separate hosts, the lease in etcd
    ("topics-local", 40, 1000),
    ("topics-jetstream", 35, 1000),
    ("groups", 25, 50),  # acknowledged commits: ~190 here, 91 in a loaded CI run (restarts take longer)
    ("groups-jetstream-clock", 30, 100),
    ("spark-cluster", 30, 1000),
    ("spark-queue", 30, 1000),  # the source a mesh queue's topic
    ("spark-jetstream", 30, 1000),  # the source a topic on JetStream R3
    ("mates-race", 40, 1000),  # issue 53: the scripted race (a standby gone while etcd writes it in)
    ("mesh-resend", 10, 59_000),  # issue 53: a whole spool resent after 55,000 from another source
]


@pytest.mark.timeout(360)  # the run's 280 s, then 60 s to clean up if it overran
@pytest.mark.parametrize(("workload", "duration", "at_least"), SHORT_RUNS)
def test_nothing_acknowledged_is_lost_under_every_nemesis(
    workload: str, duration: int, at_least: int
) -> None:
    assert not can_build(), f"MESHPLANE_REQUIRE_CHAOS=1: {can_build()}"
    # The run in a process of its own (it moves into its namespaces); stopped with SIGTERM if it
    # overruns, so that it still heals, stops its servers and removes its namespaces.
    command = [
        *(sys.executable, "-m", "tests.chaos", "--one", "--workload", workload, "--seed", str(SEED)),
        *("--duration", str(duration), "--short", "--fsync", "always", "--nemesis", "all"),
    ]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        output, errors = run.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        run.terminate()
        output, errors = run.communicate(timeout=60)
    print(errors)  # the schedule as applied, what showed each fault acting, and the verdicts
    lines = output.strip().splitlines()
    assert lines, f"the run failed (exit {run.returncode}): {errors[-3000:]}"
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
