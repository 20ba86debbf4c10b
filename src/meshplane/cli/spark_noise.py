"""Keep PySpark's shutdown noise off the screen of ``meshplane pipeline demo``.

When a session stops while a reused Python worker is idle, PySpark's daemon prints "PySpark daemon
failed to flush the output to the worker process" and a ``BrokenPipeError`` traceback, or the
traceback alone (SPARK-54344):
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
#: How a frame of PySpark's daemon is named in a traceback, and the exceptions of its shutdown.
_DAEMON = "pyspark/daemon.py"
BROKEN_CONNECTION = ("BrokenPipeError", "ConnectionResetError")
#: Lines that continue a traceback after its exception line (chained exceptions).
CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


class DaemonNoise:
    """Which stderr lines to pass: all but the daemon's shutdown tracebacks (with or without its
    flush-failure line) and the JVM's incubator notice. Pure.

    A traceback is held until its exception line: dropped when every frame is in PySpark's daemon
    and the exception is a broken connection, passed whole otherwise.
    """

    MAX_HELD = 256  # lines of one traceback held back; a longer one is passed as it is

    def __init__(self) -> None:
        self.dropped_blocks = 0
        self._in_block = False
        self._after_block = False  # the exception line was seen; a chained traceback may follow
        self._held: list[str] = []

    def feed(self, line: str) -> list[str]:
        """The lines to write now for this one (none while a traceback is held)."""
        text = line.rstrip("\r\n")
        if self._held:
            return self._hold(line, text)
        if text.startswith(FLUSH_FAILURE):
            self.dropped_blocks += 1
            self._in_block, self._after_block = True, False
            return []
        if self._after_block:
            if not text.strip():
                return []
            if text in CHAINED:
                self._in_block, self._after_block = True, False
                return []
            self._after_block = False
        elif self._in_block:
            if text and not text[0].isspace() and not text.startswith("Traceback ") and text not in CHAINED:
                self._in_block, self._after_block = False, True  # "BrokenPipeError: [Errno 32] Broken pipe"
            return []
        if text == "Traceback (most recent call last):":
            self._held = [line]
            return []
        return [] if text.startswith(INCUBATOR_NOTICE) else [line]

    def _hold(self, line: str, text: str) -> list[str]:
        self._held.append(line)
        if not text or text[0].isspace():
            return self.finish() if len(self._held) > self.MAX_HELD else []
        held, self._held = self._held, []
        frames = [h for h in held if h.lstrip().startswith('File "')]
        from_daemon = bool(frames) and all(_DAEMON in f for f in frames)
        if from_daemon and text.startswith(BROKEN_CONNECTION):
            self.dropped_blocks += 1
            self._after_block = True
            return []
        return held

    def finish(self) -> list[str]:
        """What is still held (the stream ended inside a traceback)."""
        held, self._held = self._held, []
        return held


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
                for line in self.noise.feed(raw.decode(errors="replace")):
                    os.write(self._real, line.encode())
        for line in self.noise.finish():
            os.write(self._real, line.encode())

    def close(self, timeout: float) -> None:
        """Give descriptor 2 back; the filter ends once every child holding it has exited."""
        os.dup2(self._real, 2)
        self._pump.join(timeout)
