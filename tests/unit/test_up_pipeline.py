"""`up`'s pipeline supervisor on real processes: restarted when it dies, then reported dead with its
reason and log; stopped with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from meshplane.cli.up_pipeline import MAX_RESTARTS, PipelineSupervisor, last_line, pipeline_holder
from tests.helpers import eventually, wait_until


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


SLEEPER_WITH_A_CHILD = (
    "import os, subprocess, sys, time; "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {child.pid}'); "
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); "
    "time.sleep(600)"
)


def test_a_pipeline_dies_with_its_supervisor_however_the_supervisor_dies(tmp_path: Path) -> None:
    """Issue 53, item 4: `up` killed with SIGKILL (it can clean nothing up) takes its pipeline with it:
    the guard gets a parent-death signal and kills its whole process group (the JVM's stand-in here
    is the pipeline's own child)."""
    pids = tmp_path / "pids"
    up = (
        "import asyncio, sys\nfrom pathlib import Path\n"
        "from meshplane.cli.up_pipeline import PipelineSupervisor\n"
        "async def main():\n"
        f"    s = PipelineSupervisor([sys.executable, '-c', {SLEEPER_WITH_A_CHILD!r}, {str(pids)!r}], "
        f"Path({str(tmp_path / 'log')!r}), pid_file=Path({str(tmp_path / 'pipeline.pid')!r}))\n"
        "    await s.start()\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", up])
    try:
        wait_until(pids.exists, timeout=30, what="the pipeline and its child started")
        pipeline, child = (int(pid) for pid in pids.read_text().split())
        guard = int((tmp_path / "pipeline.pid").read_text())
        assert pipeline_holder(tmp_path / "pipeline.pid") == guard  # named while it runs
        assert os.getpgid(pipeline) == os.getpgid(child) == guard
        supervisor.kill()
        supervisor.wait()
        for pid in (guard, pipeline, child):
            wait_until(lambda pid=pid: not _alive(pid), timeout=30, what=f"pid {pid} gone")  # type: ignore[misc]
        assert pipeline_holder(tmp_path / "pipeline.pid") is None  # its pid file stays, naming nothing
    finally:
        if supervisor.poll() is None:
            supervisor.kill()


def test_only_a_live_pipeline_guard_is_named_as_holding_the_checkpoint(tmp_path: Path) -> None:
    pid_file = tmp_path / "pipeline.pid"
    assert pipeline_holder(pid_file) is None
    pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a pipeline (pids are reused)
    assert pipeline_holder(pid_file) is None
    pid_file.write_text("garbage")
    assert pipeline_holder(pid_file) is None
