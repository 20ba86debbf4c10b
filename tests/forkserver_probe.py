"""Started by tests/unit/test_spark_forkserver.py as ``python -m tests.forkserver_probe MODE``: it reports
how it was started (one JSON line, with the line it reads from stdin), then exits as MODE says."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> None:
    mode = sys.argv[1]
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "probe": os.environ.get("PROBE"),
        "stdin": sys.stdin.readline().strip(),
        "main": __name__,
    }
    print(json.dumps(report), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if mode == "exit":
        sys.exit(7)
    if mode == "sleep":
        time.sleep(120)
    if mode == "signal":
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main()
