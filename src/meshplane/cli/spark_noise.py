"""Keep PySpark's shutdown noise off the screen of ``meshplane pipeline demo``.

When a session stops while a reused Python worker is idle, PySpark's daemon prints "PySpark daemon
failed to flush the output to the worker process" and a ``BrokenPipeError`` traceback (SPARK-54344):
expected at shutdown, alarming on screen, and printed by a process Spark forks, so no Spark setting
or log level reaches it; likewise the JVM's "Using incubator modules" notice. Spark's processes
inherit file descriptor 2: ``ChildStderr`` puts a filter there that drops those lines and passes
every other line through.
"""

from __future__ import annotations

import os
import sys
import threading

FLUSH_FAILURE = "PySpark daemon failed to flush the output to the worker process"
#: The JVM's notice that Spark's launcher enabled an incubator module: no user can act on it.
INCUBATOR_NOTICE = "WARNING: Using incubator modules:"
#: Lines that continue a traceback after its exception line (chained exceptions).
CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


class DaemonNoise:
    """Which stderr lines to keep: all but the daemon's flush-failure block and the JVM's incubator
    notice. Pure."""

    def __init__(self) -> None:
        self.dropped_blocks = 0
        self._in_block = False
        self._after_block = False  # the exception line was seen; a chained traceback may follow

    def keep(self, line: str) -> bool:
        text = line.rstrip("\r\n")
        if text.startswith(FLUSH_FAILURE):
            self.dropped_blocks += 1
            self._in_block, self._after_block = True, False
            return False
        if self._after_block:
            if not text.strip():
                return False
            if text in CHAINED:
                self._in_block, self._after_block = True, False
                return False
            self._after_block = False
            return True
        if not self._in_block:
            return not text.startswith(INCUBATOR_NOTICE)
        if text and not text[0].isspace() and not text.startswith("Traceback ") and text not in CHAINED:
            self._in_block, self._after_block = False, True  # e.g. "BrokenPipeError: [Errno 32] Broken pipe"
        return False


class ChildStderr:
    """From its start, what is written to file descriptor 2 (and so by the processes started from
    then on, such as Spark's JVM and its Python daemon) passes through ``DaemonNoise`` to the real
    stderr. This process's own ``sys.stderr`` writes to the real stderr directly, so nothing of ours
    waits on the filter's thread."""

    def __init__(self) -> None:
        self.noise = DaemonNoise()
        self._real = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        sys.stderr.flush()
        sys.stderr = open(self._real, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        self._pump = threading.Thread(
            target=self._forward, args=(read_end,), name="stderr-filter", daemon=True
        )
        self._pump.start()

    def _forward(self, read_end: int) -> None:
        with open(read_end, "rb") as lines:
            for raw in lines:
                if self.noise.keep(raw.decode(errors="replace")):
                    os.write(self._real, raw)

    def close(self, timeout: float) -> None:
        """Give descriptor 2 back; the filter ends once every child holding it has exited."""
        os.dup2(self._real, 2)
        self._pump.join(timeout)
