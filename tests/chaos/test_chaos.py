"""The short schedule of the fault harness, inside the suite: real nodes in network namespaces, every
nemesis once or more, nothing acknowledged lost, doubled or reordered. CI replays one seed; a
developer's run draws one (printed, so a failure replays with ``python -m tests.chaos --seed N``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.network import can_build
from tests.chaos.schedule import NEMESES

pytestmark = pytest.mark.skipif(bool(can_build()), reason=can_build() or "")

SEED = 36 if os.environ.get("CI") else random.randrange(1 << 31)


@pytest.mark.timeout(300)
def test_guaranteed_mesh_events_survive_every_nemesis(tmp_path: Path) -> None:
    out = tmp_path / "reports.json"
    command = [
        sys.executable,
        "-m",
        "tests.chaos",
        "--seed",
        str(SEED),
        "--duration",
        "60",
        "--json",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    print(done.stderr)  # the schedule as applied, and the verdicts
    assert out.exists(), done.stderr[-3000:]
    (report,) = json.loads(out.read_text())
    assert {fault["kind"] for fault in report["faults"]} == set(NEMESES), f"seed {SEED}"
    total = report["total"]
    assert total["acknowledged"] > 1000, total
    assert (total["lost"], total["duplicated"], total["reordered"], total["unexpected"]) == (0, 0, 0, 0), (
        f"seed {SEED}: {total}"
    )
    assert done.returncode == 0
