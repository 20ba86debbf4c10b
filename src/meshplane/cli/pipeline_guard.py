"""``python -m meshplane.cli.pipeline_guard PARENT -- COMMAND...``: runs ``up``'s Spark pipeline so that
it dies with ``up`` however ``up`` dies (``kill -9`` included), with everything it started (its JVM,
Python workers, the forkserver).

The guard leads a session of its own (the supervisor starts it so) and runs COMMAND in its process
group. The kernel sends it SIGHUP when its parent dies (``PR_SET_PDEATHSIG``; elsewhere than Linux, a
thread polls the parent's pid): it then kills the whole group. SIGTERM (a graceful stop) goes to
COMMAND, and the guard exits as COMMAND did.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # not Linux: look for ourselves
        threading.Thread(target=_poll_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was asked for
        _kill_group()


def _poll_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    _kill_group()


def _kill_group(*_: object) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # this guard too


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m meshplane.cli.pipeline_guard PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    signal.signal(signal.SIGHUP, _kill_group)
    _die_with_parent(int(argv[0]))
    child = subprocess.Popen(argv[2:])
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    code = child.wait()
    if code < 0:  # killed by a signal: so is the guard, for the supervisor to say which
        signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
