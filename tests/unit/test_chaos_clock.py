"""The clock nemesis's file (``tests/chaos/clock/sitecustomize.py``) steps the wall clock of the
process's own code, not grpc's deadlines: after a real step grpc's Python layer and its C core read
the same clock, so an etcd call's timeout still counts from now (issue 53: a mate stepped back 20 s
failed over on "Deadline Exceeded", an artifact of the fake clock)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from meshplane.launchers import EtcdServer
from tests.chaos.harness import CLOCK_DIR

PROBE = """
import asyncio, sys, time
from meshplane.mesh.lease import MateLease

async def main():
    behind = time.clock_gettime(time.CLOCK_REALTIME) - time.time()
    lease = MateLease((sys.argv[1],), "clock", "a", "t", timeout=2.0)
    try:
        print(round(behind), await lease.current())
    finally:
        await lease.close()

asyncio.run(main())
"""


def test_a_step_back_reaches_the_process_but_not_grpcs_deadlines(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    clock = tmp_path / "clock"
    clock.write_text("-20")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, etcd_server.endpoint],
        env={"PYTHONPATH": str(CLOCK_DIR), "MESHPLANE_CHAOS_CLOCK": str(clock), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["20", "(None,", "0)"]  # 20 s behind, and etcd answered
    assert (tmp_path / "clock.seen").read_text() == "-20.0"
