"""The logs of the servers a failed test ran, in its report: why a node closed a connection is in its
log, and a server's folder (the log with it) is removed when it stops. Live servers (the test's own and
the shared ones) and those stopped since the test began, the last lines of each."""

from __future__ import annotations

import os
import weakref
from typing import Any

from meshplane.launchers.base import ServerProcess

TAIL_LINES = 40
TAIL_BYTES = 8192  # of the log's end, read: a server's log (or one line of it) may be large
MAX_STOPPED = 64  # a test that starts hundreds of servers keeps its first ones' tails only

_live: weakref.WeakSet[ServerProcess] = weakref.WeakSet()
_stopped: list[str] = []


def _tail(server: ServerProcess) -> str:
    pid = server.proc.pid if server.proc is not None else "-"
    try:
        with server.log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - TAIL_BYTES))
            lines = log.read().decode(errors="replace").splitlines()[-TAIL_LINES:]
    except OSError:
        lines = ["(no log)"]
    return "\n".join([f"--- {type(server).__name__} pid {pid}, {server.workdir}", *lines])


def install() -> None:
    """Follow every server started from now on (its log read before its folder goes)."""
    started, cleanup = ServerProcess.__init__, ServerProcess.cleanup

    def following(self: ServerProcess, *args: Any, **kwargs: Any) -> None:
        started(self, *args, **kwargs)
        _live.add(self)

    def keeping_tail(self: ServerProcess) -> None:
        self.stop()  # what it says as it stops is in its log too
        if self.proc is not None and len(_stopped) < MAX_STOPPED:
            _stopped.append(_tail(self))
        _live.discard(self)
        cleanup(self)

    ServerProcess.__init__ = following  # type: ignore[method-assign]
    ServerProcess.cleanup = keeping_tail  # type: ignore[method-assign]


def begin_test() -> None:
    _stopped.clear()


def tails() -> str:
    """The tails of the servers' logs: those stopped during the test, then those still running."""
    return "\n".join([*_stopped, *(_tail(server) for server in list(_live) if server.proc is not None)])
