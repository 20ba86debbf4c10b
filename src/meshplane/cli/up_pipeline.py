"""The Spark pipeline of ``meshplane up``, supervised: restarted when it dies (a few times, backing
off), then reported dead with its reason and log, in the status line, ``up.json`` and ``meshplane
status``; never left looking alive."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MAX_RESTARTS = 3
FIRST_BACKOFF = 2.0  # seconds; doubled at each restart
REASON_CHARS = 200


@dataclass(frozen=True)
class PipelineHealth:
    state: str  # running | restarting | dead | finished
    pid: int | None
    restarts: int
    reason: str  # why it last stopped ("" while it never has)
    log: str

    def summary(self) -> str:
        """What the status line says."""
        restarts = f", restarted {self.restarts}x" if self.restarts else ""
        if self.state == "running":
            return f"Spark running{restarts}"
        if self.state == "restarting":
            return f"Spark restarting ({self.restarts}/{MAX_RESTARTS}: {self.reason})"
        if self.state == "finished":
            return "Spark finished"
        return f"Spark DEAD ({self.reason}; log {self.log})"


def last_line(log: Path) -> str:
    """The last non-empty line of the log: pipeline commands end with a one-line reason."""
    try:
        with log.open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - 8192))
            lines = file.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    found = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return found[:REASON_CHARS]


def pipeline_holder(pid_file: Path) -> int | None:
    """The pid of a pipeline an earlier ``up`` left running (its process group holds the checkpoint),
    or None."""
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if GUARD.encode() in command else None


GUARD = "meshplane.cli.pipeline_guard"
PIPELINE_PID_FILE = "pipeline.pid"  # in the state directory, while up's pipeline runs


class PipelineSupervisor:
    """Runs ``argv`` with its output in ``log``, under :mod:`.pipeline_guard` (a session of its own,
    dying with this process however it dies: Spark's JVM goes with it). ``pid_file`` names it while it
    runs."""

    def __init__(
        self, argv: list[str], log: Path, first_backoff: float = FIRST_BACKOFF, pid_file: Path | None = None
    ) -> None:
        self.argv = [sys.executable, "-m", GUARD, str(os.getpid()), "--", *argv]
        self.pid_file = pid_file
        self.log = log
        self.first_backoff = first_backoff
        self._process: asyncio.subprocess.Process | None = None
        self._state = "running"
        self._restarts = 0
        self._reason = ""
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @property
    def health(self) -> PipelineHealth:
        pid = self._process.pid if self._process is not None and self._state == "running" else None
        return PipelineHealth(self._state, pid, self._restarts, self._reason, str(self.log))

    async def start(self) -> None:
        await self._spawn()
        self._task = asyncio.create_task(self._watch())

    async def _spawn(self) -> None:
        with self.log.open("ab") as out:  # the child keeps its own descriptor
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting the pipeline\n".encode())
            out.flush()
            self._process = await asyncio.create_subprocess_exec(
                *self.argv, start_new_session=True, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL
            )
        self._state = "running"
        if self.pid_file is not None:
            self.pid_file.write_text(f"{self._process.pid}\n")

    async def _watch(self) -> None:
        while True:
            assert self._process is not None
            code = await self._process.wait()
            if self._stopping:
                return
            self._kill_group()  # its JVM, if it outlived it
            if code == 0:
                self._state = "finished"
                return
            self._reason = _exit_reason(code, last_line(self.log))
            if self._restarts >= MAX_RESTARTS:
                self._state = "dead"
                return
            self._restarts += 1
            self._state = "restarting"
            await asyncio.sleep(self.first_backoff * 2 ** (self._restarts - 1))
            if self._stopping:
                return
            await self._spawn()

    def _kill_group(self) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                self._kill_group()
                await process.wait()
        self._kill_group()
        if self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)


def _exit_reason(code: int, line: str) -> str:
    how = f"exit {code}"
    if code < 0:
        with contextlib.suppress(ValueError):
            how = f"killed by {signal.Signals(-code).name}"
    return f"{how}: {line}" if line and not line.startswith("---") else how
