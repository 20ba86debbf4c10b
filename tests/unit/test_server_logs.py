"""A failed test's report ends with its servers' logs (``tests/support/server_logs.py``): what it adds
is bounded whatever a server wrote, and a server with no log, or never started, breaks no run."""

from __future__ import annotations

import subprocess
import sys
import time

from meshplane.launchers.base import ServerProcess
from tests.support import server_logs

SAYS_WHEN_STOPPED = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("stopped", flush=True), sys.exit(0)))
print("listening", flush=True)
time.sleep(60)
"""


class Logged(ServerProcess):
    def start(self) -> None:
        self._spawn([sys.executable, "-c", SAYS_WHEN_STOPPED])


def test_a_tail_is_bounded_in_bytes_however_long_the_servers_lines() -> None:
    server = Logged()
    try:
        server.log_path.write_bytes(b"x" * 5_000_000 + b"\nthe last line\n")
        tail = server_logs._tail(server)
        assert tail.endswith("the last line")
        assert len(tail) <= server_logs.TAIL_BYTES + 200
    finally:
        server.cleanup()


def test_a_stopped_servers_tail_is_its_log_as_it_stopped_and_one_without_a_log_breaks_nothing() -> None:
    server_logs.begin_test()
    server = Logged()
    server.start()
    deadline = time.monotonic() + 30
    while b"listening" not in server.log_path.read_bytes():
        assert time.monotonic() < deadline, "the server never said it listens"
        time.sleep(0.02)
    server.cleanup()  # stopped first, its log read, then its folder removed
    assert server.proc is not None
    assert server.proc.poll() is not None
    assert "listening\nstopped" in server_logs.tails()  # what it said as it stopped too
    assert not server.workdir.exists()

    never = Logged()  # never started: nothing to show, nothing kept
    never.cleanup()
    gone = Logged()
    gone.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.proc.wait()
    gone.log_path.parent.rmdir()  # its folder removed under it
    gone.cleanup()
    assert "(no log)" in server_logs.tails()
    server_logs.begin_test()  # the next test's report: without this one's stopped servers (the
    tails = server_logs.tails()  # session's live ones, started by other tests of the worker, stay)
    assert "(no log)" not in tails
    assert "listening\nstopped" not in tails
