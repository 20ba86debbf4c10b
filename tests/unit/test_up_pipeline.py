"""`up`'s pipeline supervisor on real processes: restarted when it dies, then reported dead with its
reason and log; stopped with everything it started."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from meshplane.cli.up_pipeline import MAX_RESTARTS, PipelineSupervisor, last_line
from tests.helpers import eventually


async def test_a_pipeline_that_keeps_failing_is_restarted_then_reported_dead_with_its_reason(
    tmp_path: Path,
) -> None:
    log = tmp_path / "pipeline.log"
    failing = [sys.executable, "-c", "import sys; print('noise'); print('no spark: JAVA_HOME'); sys.exit(3)"]
    supervisor = PipelineSupervisor(failing, log, first_backoff=0.01)
    await supervisor.start()
    await eventually(lambda: supervisor.health.state == "dead", timeout=30)
    health = supervisor.health
    assert health.restarts == MAX_RESTARTS
    assert health.reason == "exit 3: no spark: JAVA_HOME"
    assert health.pid is None
    assert log.read_text().count("starting the pipeline") == MAX_RESTARTS + 1
    assert health.summary() == f"Spark DEAD (exit 3: no spark: JAVA_HOME; log {log})"
    await supervisor.stop()


async def test_a_killed_pipeline_comes_back_and_stop_takes_its_children_too(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child"
    written = tmp_path / "child.tmp"  # renamed into place: a reader never sees it half written
    program = (
        "import os, subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(written)!r}, 'w').write(str(child.pid)); "
        f"os.replace({str(written)!r}, {str(child_pid_file)!r}); "
        "time.sleep(600)"
    )
    supervisor = PipelineSupervisor([sys.executable, "-c", program], tmp_path / "log", first_backoff=0.01)
    await supervisor.start()
    first = supervisor.health.pid
    assert first is not None
    await eventually(child_pid_file.exists, timeout=30)
    orphan = int(child_pid_file.read_text())
    os.kill(first, signal.SIGKILL)
    await eventually(lambda: supervisor.health.pid not in (None, first), timeout=30)
    health = supervisor.health
    assert (health.state, health.restarts, health.reason) == ("running", 1, "killed by SIGKILL")
    assert health.summary() == "Spark running, restarted 1x"
    await eventually(lambda: not _alive(orphan), timeout=30)  # the dead one's children went with it
    await eventually(lambda: child_pid_file.read_text() != str(orphan), timeout=30)
    second_child = int(child_pid_file.read_text())
    await supervisor.stop()
    await eventually(lambda: not _alive(second_child), timeout=30)
    assert supervisor.health.restarts == 1  # stopped by us: not counted as a failure


async def test_a_finished_pipeline_is_not_restarted(tmp_path: Path) -> None:
    supervisor = PipelineSupervisor([sys.executable, "-c", "print('done')"], tmp_path / "log", 0.01)
    await supervisor.start()
    await eventually(lambda: supervisor.health.state == "finished", timeout=30)
    assert supervisor.health.restarts == 0
    assert last_line(tmp_path / "log") == "done"
    await supervisor.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): count it as gone
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
