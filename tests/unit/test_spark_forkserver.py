"""The fork server Spark's one-off Python processes are forked from (each streaming query's source
runner): real server, real launcher (`meshplane-spark-python`), a probe module as the child."""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshplane.spark import forkserver, worker_python
from tests.helpers import wait_until

LAUNCHER = Path(sys.executable).with_name("meshplane-spark-python")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    proc, path = forkserver.spawn()
    wait_until(lambda: os.path.exists(path), timeout=30, what="the fork server's socket")
    assert os.listdir(f"/proc/{proc.pid}/task") == [str(proc.pid)]  # one thread: forking is safe
    yield proc, path
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def launch(path: str, mode: str, **env: str) -> subprocess.Popen[str]:
    settings = {**os.environ, **forkserver.SPARK_WORKER_SETTINGS, forkserver.ENV: path, "PROBE": "p"}
    proc = subprocess.Popen(
        [str(LAUNCHER), "-m", "tests.forkserver_probe", mode],
        env={**settings, **env},
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write("hello\n")
    proc.stdin.flush()
    return proc


def report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    return dict(json.loads(proc.stdout.readline()))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_module_runs_forked_from_the_server_with_the_launchers_streams_environment_and_exit_code(
    server: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc = launch(server[1], "exit")
    got = report(proc)
    assert got["ppid"] == server[0].pid  # forked by the server, not started by the launcher
    assert got["pid"] != proc.pid
    assert (got["argv"], got["cwd"], got["probe"], got["stdin"], got["main"]) == (
        ["exit"],
        str(ROOT),
        "p",
        "hello",
        "__main__",
    )
    assert proc.wait(timeout=30) == 7
    assert proc.stderr is not None
    assert "to stderr" in proc.stderr.read()


def test_a_child_killed_by_a_signal_ends_its_launcher_by_the_same_signal(
    server: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc = launch(server[1], "signal")
    assert report(proc)["ppid"] == server[0].pid
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_killing_the_launcher_ends_the_child(server: tuple[subprocess.Popen[bytes], str]) -> None:
    proc = launch(server[1], "sleep")
    child = report(proc)["pid"]
    proc.kill()  # as Spark stops a worker
    proc.wait(timeout=30)
    wait_until(lambda: gone(child), timeout=30, what="the child ended")


def test_other_interpreter_settings_are_refused_and_a_fresh_python_runs_instead(
    server: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc = launch(server[1], "exit", PYTHONHASHSEED="1")
    got = report(proc)
    assert got["pid"] == proc.pid  # the launcher became the Python itself
    assert proc.wait(timeout=30) == 7
    assert proc.stderr is not None
    assert "not forked (interpreter settings differ: PYTHONHASHSEED)" in proc.stderr.read()


def _as_a_spark_worker(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in {**forkserver.SPARK_WORKER_SETTINGS, **env}.items():
        monkeypatch.setenv(name, value)


def test_a_refusal_that_comes_before_the_launcher_is_done_writing_still_says_why(
    server: tuple[subprocess.Popen[bytes], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A loaded machine's order, made certain: the launcher is preempted as soon as its request is out,
    and the server reads it, refuses, answers and hangs up before the launcher's next step. That step
    wrote nothing (a `sendall` of the empty rest, which still makes a `send`) and got a broken pipe:
    the launcher said "no answer: Broken pipe" with the server's reason waiting unread."""
    send_fds = socket.send_fds

    def send_and_be_preempted(sock: socket.socket, *args: Any) -> int:
        sent = send_fds(sock, *args)
        poller = select.poll()
        poller.register(sock, select.POLLIN)

        def hung_up() -> bool:
            return any(events & select.POLLHUP for _, events in poller.poll(0))

        wait_until(hung_up, timeout=30, what="the server answered and hung up")
        return int(sent)

    monkeypatch.setattr(socket, "send_fds", send_and_be_preempted)
    _as_a_spark_worker(monkeypatch, PYTHONHASHSEED="1")
    assert worker_python.run_forked(server[1], ["-m", "tests.forkserver_probe", "exit"]) is None
    assert "not forked (interpreter settings differ: PYTHONHASHSEED)" in capsys.readouterr().err


def test_a_request_refused_by_its_length_says_why_though_the_server_hangs_up_mid_write(
    server: tuple[subprocess.Popen[bytes], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server refuses a request over MAX_REQUEST from its length, answers and hangs up without
    reading the rest: the launcher's writes fail, and it must read the answer all the same."""
    _as_a_spark_worker(monkeypatch, BIG="x" * 2 * forkserver.MAX_REQUEST)
    assert worker_python.run_forked(server[1], ["-m", "tests.forkserver_probe", "exit"]) is None
    assert f"(at most {forkserver.MAX_REQUEST})): starting a fresh Python" in capsys.readouterr().err
    monkeypatch.delenv("BIG")
    proc = launch(server[1], "exit")  # and it serves on
    assert report(proc)["ppid"] == server[0].pid
    assert proc.wait(timeout=30) == 7


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """A request that does not end for 10 s: its length, then a byte at a time, each well within the
    timeout; then it ends early (not to hold a server that waits out each read for an hour)."""
    socket.send_fds(sock, [struct.pack(">I", 100_000) + b"{"], [0, 1, 2])
    deadline = time.monotonic() + 10
    while not stop.wait(0.05) and time.monotonic() < deadline:
        try:
            sock.sendall(b" ")
        except OSError:
            return  # the server hung up
    sock.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize("trickle", [False, True], ids=["nothing", "a-trickle"])
def test_a_request_not_all_sent_within_the_timeout_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trickle: bool
) -> None:
    """The server reads one launcher at a time: one that sends nothing, or trickles its request, holds
    up every other launcher until REQUEST_TIMEOUT, which bounds the whole request (it bounded each read),
    and is told why it was refused (it was hung up on without a word)."""
    monkeypatch.setattr(forkserver, "REQUEST_TIMEOUT", 1.0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "socket"))
    listener.listen(1)
    server = forkserver.ForkServer(listener)
    launcher = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    launcher.connect(str(tmp_path / "socket"))
    stop = threading.Event()
    writer = threading.Thread(target=_trickle, args=(launcher, stop)) if trickle else None
    if writer is not None:
        writer.start()
    started = time.monotonic()
    try:
        server._accept(None)
        waited = time.monotonic() - started
    finally:
        stop.set()
        if writer is not None:
            writer.join(timeout=30)
    launcher.settimeout(30)
    answer = json.loads(launcher.makefile("rb").readline() or b"{}")
    assert "within 1 s" in answer.get("refused", ""), answer
    assert waited >= 1.0  # not refused before its time
    assert server.children == {}
    launcher.close()
    listener.close()


def test_without_a_server_the_launcher_starts_a_fresh_python(tmp_path: Path) -> None:
    proc = launch(str(tmp_path / "no-socket"), "exit")
    assert report(proc)["pid"] == proc.pid
    assert proc.wait(timeout=30) == 7
    assert proc.stderr is not None
    assert "not forked" not in proc.stderr.read()


def _raw_request(path: str, data: bytes, fds: list[int]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        socket.send_fds(sock, [data], fds) if fds else sock.sendall(data)
        return dict(json.loads(sock.makefile("rb").readline()))


@pytest.mark.parametrize(
    ("data", "with_fds", "reason"),
    [
        (struct.pack(">I", 5) + b"{nope", True, "not JSON"),
        (struct.pack(">I", 1 << 30), True, "at most"),
        (struct.pack(">I", 2) + b"[]", True, "not a JSON object"),
        (struct.pack(">I", 2) + b"{}", False, "0 file descriptors"),
    ],
)
def test_bad_requests_are_refused_with_the_reason_and_the_server_serves_on(
    server: tuple[subprocess.Popen[bytes], str], data: bytes, with_fds: bool, reason: str
) -> None:
    fds = [0, 1, 2] if with_fds else []
    assert reason in _raw_request(server[1], data, fds)["refused"]
    proc = launch(server[1], "exit")
    assert report(proc)["ppid"] == server[0].pid
    assert proc.wait(timeout=30) == 7


def _request(**changes: Any) -> dict[str, Any]:
    request = {"executable": sys.executable, "argv": ["-m", "x"], "env": dict(os.environ), "cwd": str(ROOT)}
    return {**request, **changes}


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (_request(argv=["-c", "print(1)"]), "only `-m module`"),
        (_request(executable="/usr/bin/python3.9"), "another interpreter"),
        (_request(cwd="/nonexistent"), "cwd is not a directory"),
        (_request(env={"A": 1}), "env is not an object of strings"),
    ],
)
def test_plan_refuses_what_a_fresh_python_would_run_differently(
    request_: dict[str, Any], reason: str
) -> None:
    with pytest.raises(forkserver.Refused, match=reason):
        forkserver.plan(request_)


def test_a_link_to_this_interpreter_in_its_folder_is_this_interpreter(tmp_path: Path) -> None:
    # A venv's python is a link to its python3 (or the other way round): the same interpreter.
    here = Path(sys.executable)
    others = [p for p in here.parent.iterdir() if p.name.startswith("python") and p != here]
    same = [p for p in others if os.path.realpath(p) == os.path.realpath(here)]
    assert same, f"no second name for {here} in its folder"
    forkserver.plan(_request(executable=str(same[0])))  # not refused
    elsewhere = tmp_path / "python"
    elsewhere.symlink_to(os.path.realpath(here))  # the same binary, another folder: not this venv
    with pytest.raises(forkserver.Refused, match="another interpreter"):
        forkserver.plan(_request(executable=str(elsewhere)))


def test_a_path_that_imports_a_loaded_package_from_elsewhere_is_refused(tmp_path: Path) -> None:
    assert forkserver.moved_packages(forkserver.child_path(str(ROOT), "")) == []
    (tmp_path / "pytest").mkdir()
    (tmp_path / "pytest" / "__init__.py").write_text("")
    # pytest: a third-party package loaded here, as pyspark is in the server
    assert "pytest" in forkserver.moved_packages(forkserver.child_path(str(ROOT), str(tmp_path)))


def test_interpreter_settings_are_the_pythons_own_variables() -> None:
    env = {"PYTHONHASHSEED": "0", "PYTHONPATH": "/x", "PYTHON_WORKER_FACTORY_PORT": "1", "HOME": "/root"}
    assert forkserver.interpreter_settings(env) == {"PYTHONHASHSEED": "0"}


def test_the_server_ends_with_its_driver_and_takes_its_children_and_socket_along() -> None:
    proc, path = forkserver.spawn()
    wait_until(lambda: os.path.exists(path), timeout=30, what="the fork server's socket")
    child = launch(path, "sleep")
    pid = report(child)["pid"]
    assert proc.stdin is not None
    proc.stdin.close()  # the driver is gone
    assert proc.wait(timeout=30) == 0
    wait_until(lambda: gone(pid), timeout=30, what="the child ended")
    assert child.wait(timeout=30) == -signal.SIGTERM
    assert not os.path.exists(os.path.dirname(path))


def test_a_child_that_exits_as_its_launcher_closes_is_handled_once(tmp_path: Path) -> None:
    """Both become readable in one select round: the exit is handled first (it answers and closes the
    launcher's connection), then the launcher's stale readiness must find nothing to do. The server
    died of StopIteration there, under load, taking every later Spark worker with it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "socket"))
    server = forkserver.ForkServer(listener)
    ours, launcher = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    pidfd = os.pidfd_open(pid)
    server.children[pid] = forkserver._Child(pid, pidfd, ours)
    server.selector.register(ours, selectors.EVENT_READ, server._launcher_readable)
    server.selector.register(pidfd, selectors.EVENT_READ, server._exited)
    launcher.close()
    server._exited(pidfd)
    server._launcher_readable(ours)
    assert server.children == {}
    listener.close()
