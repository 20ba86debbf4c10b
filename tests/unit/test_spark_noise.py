"""PySpark's shutdown traceback is dropped from `pipeline demo`'s stderr; every other line passes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from meshplane.cli.spark_noise import DaemonNoise

FLUSH_BLOCK = [
    "PySpark daemon failed to flush the output to the worker process:",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/pyspark/daemon.py", line 95, in worker',
    "    outfile.flush()",
    "BrokenPipeError: [Errno 32] Broken pipe",
    "",
]
CHAINED_BLOCK = [
    *FLUSH_BLOCK[:4],
    "EOFError",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/pyspark/daemon.py", line 95, in worker',
    "BrokenPipeError: [Errno 32] Broken pipe",
    "",
]


DAEMON_TRACEBACK = [  # the same shutdown, without the flush-failure line (seen in about one run in 30)
    "Traceback (most recent call last):",
    '  File "/venv/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 264, in manager',
    '  File "/venv/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 95, in worker',
    "BrokenPipeError: [Errno 32] Broken pipe",
]


def kept(lines: list[str]) -> list[str]:
    noise = DaemonNoise()
    passed = [out.rstrip("\n") for line in lines for out in noise.feed(line + "\n")]
    return passed + [out.rstrip("\n") for out in noise.finish()]


def test_the_flush_failure_block_is_dropped_and_the_lines_around_it_kept() -> None:
    notice = "WARNING: Using incubator modules: jdk.incubator.vector"
    assert kept([notice, "pipeline: started", *FLUSH_BLOCK, "pipeline: 12 windows"]) == [
        "pipeline: started",
        "pipeline: 12 windows",
    ]
    assert kept([*CHAINED_BLOCK, "done"]) == ["done"]
    assert kept(["a", *DAEMON_TRACEBACK, "", *DAEMON_TRACEBACK, "b"]) == ["a", "b"]
    noise = DaemonNoise()
    for line in FLUSH_BLOCK * 3 + DAEMON_TRACEBACK:
        noise.feed(line)
    assert noise.dropped_blocks == 4


def test_other_tracebacks_and_errors_are_kept() -> None:
    other = [
        "Traceback (most recent call last):",
        '  File "job.py", line 3, in <module>',
        "ValueError: bad window",
        "ERROR MicroBatchExecution: query failed",
    ]
    assert kept(other) == other
    assert kept([*FLUSH_BLOCK, *other]) == other
    ours = [DAEMON_TRACEBACK[0], '  File "job.py", line 3, in <module>', *DAEMON_TRACEBACK[1:]]
    assert kept(ours) == ours  # a frame of ours: not the daemon's shutdown
    wrong_error = [*DAEMON_TRACEBACK[:3], "MemoryError"]
    assert kept(wrong_error) == wrong_error
    cut = DAEMON_TRACEBACK[:3]
    assert kept(cut) == cut  # the stream ended inside it: passed at the end


def test_children_write_through_the_filter_and_the_process_itself_directly(tmp_path: Path) -> None:
    said = tmp_path / "child.txt"
    said.write_text("\n".join(["child says", *FLUSH_BLOCK, "child ends", ""]))
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        from meshplane.cli.spark_noise import ChildStderr
        child_stderr = ChildStderr()
        print("ours", file=sys.stderr)
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write(open({str(said)!r}).read())"])
        child_stderr.close(timeout=30)
        print(child_stderr.noise.dropped_blocks, "dropped", file=sys.stderr)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["ours", "child says", "child ends", "1 dropped"]
