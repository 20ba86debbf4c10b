"""A fork server for the Python processes Spark starts one at a time: each streaming query's source runner.

Spark starts a fresh Python for every streaming query that reads a Python data source (PySpark's
``python_streaming_source_runner``, which plans the query's micro-batches; unlike the readers it does
not come from PySpark's daemon). Here that costs ~0.25 s before the first batch (the interpreter, then
PySpark, PyArrow and NumPy imported); Parquet's JVM source pays nothing of the kind. ``spark_session()``
starts this server beside the driver: a Python that imported all of it once and forks a ready copy of
itself for each such process. ``meshplane-spark-python`` (worker_python.py) hands it the request
(arguments, environment, working directory, and its standard streams as file descriptors, so the child
writes where Spark reads), then waits for the child's exit status and exits with it. When the launcher
dies (Spark stops a worker by destroying it), the server ends the child.

It forks only what runs as a fresh interpreter would: ``-m module`` by the same executable with the same
interpreter settings (``PYTHONHASHSEED``, ``PYTHONUNBUFFERED``, ...), and only where the requested
path finds every preloaded package where it was loaded from. Anything else is refused, with the reason,
and the launcher starts a fresh Python. One server per driver; it exits when the driver does.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.machinery
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV = "MESHPLANE_SPARK_FORKSERVER"  # the server's socket, for the launcher
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
PRELOAD = (RUNNER, "meshplane.spark.source")
# What Spark sets for the Python it starts (PythonWorkerFactory): the server starts with the same.
SPARK_WORKER_SETTINGS = {"PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "YES"}
# A process that forks must have one thread: NumPy's OpenBLAS and PyArrow's jemalloc start theirs on
# import unless told not to (the server checks, and does not serve when it has more).
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
MAX_REQUEST = 1 << 20
MAX_CHILDREN = 256  # one per running streaming query; more start as fresh Pythons
REQUEST_TIMEOUT = 5.0
STOP_TIMEOUT = 10.0  # for the children to end on SIGTERM when the driver is gone
HEADER = struct.Struct(">I")


class Refused(Exception):
    """A request the server does not fork for; the launcher starts a fresh Python instead."""


def interpreter_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables a Python reads once, when it starts (``PYTHONHASHSEED``, ``PYTHONUNBUFFERED``, ...):
    a forked child keeps the server's. ``PYTHONPATH`` aside (see :func:`child_path`); ``PYTHON_*`` names
    are Spark's, not the interpreter's."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k[6:7] != "_" and k != "PYTHONPATH"}


def child_path(cwd: str, python_path: str) -> list[str]:
    """The ``sys.path`` of ``python -m`` started in ``cwd`` with ``python_path``: the server's own, with
    its start directory and ``PYTHONPATH`` entries replaced by the child's."""
    own = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    rest = [p for p in sys.path[0 if sys.flags.safe_path else 1 :] if p not in own]
    first = [] if sys.flags.safe_path else [cwd]
    return [*first, *(p for p in python_path.split(os.pathsep) if p), *rest]


def moved_packages(path: list[str]) -> list[str]:
    """The loaded third-party packages that ``path`` would import from somewhere else (or not at all)."""
    moved = []
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if "." in name or name == "__main__" or name in sys.stdlib_module_names or not origin:
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.origin != origin:
            moved.append(name)
    return moved


@dataclass(frozen=True)
class Plan:
    """What a forked child becomes."""

    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    path: list[str]


def same_interpreter(executable: str) -> bool:
    """Whether ``executable`` runs as this interpreter: the same binary once links are resolved
    (a venv's ``python`` is often a link to its ``python3``) from the same folder once resolved (a
    venv's links and the system's binary resolve alike, but only the venv's folder has its
    ``pyvenv.cfg`` and so its packages)."""

    def identity(path: str) -> tuple[str, str]:
        return os.path.realpath(path), os.path.realpath(os.path.dirname(os.path.abspath(path)))

    return executable == sys.executable or identity(executable) == identity(sys.executable)


def plan(request: Any) -> Plan:
    """The child a launcher's request asks for, or :class:`Refused` saying why not."""
    if not isinstance(request, dict):
        raise Refused("the request is not a JSON object")
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise Refused("argv is not a list of strings")
    if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise Refused("env is not an object of strings")
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        raise Refused("cwd is not a directory")
    executable = request.get("executable")
    if not isinstance(executable, str) or same_interpreter(executable) is False:
        raise Refused(f"another interpreter ({executable!r}, not {sys.executable!r})")
    if len(argv) < 2 or argv[0] != "-m":
        raise Refused(f"only `-m module` is forked, not {argv[:2]!r}")
    theirs, ours = interpreter_settings(env), interpreter_settings(os.environ)
    if theirs != ours:
        differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
        raise Refused(f"interpreter settings differ: {', '.join(differ)}")
    path = child_path(cwd, env.get("PYTHONPATH", ""))
    moved = moved_packages(path)
    if moved:
        raise Refused(f"the path imports {', '.join(sorted(moved))} from elsewhere")
    return Plan(argv[1], argv[2:], env, cwd, path)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def become(child: Plan, streams: list[int]) -> None:
    """In a forked child: take the launcher's streams, environment and directory, run the module as
    ``python -m`` would, and exit. Never returns."""
    code = 1
    try:
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(child.cwd)
        os.environ.clear()
        os.environ.update(child.env)
        sys.path[:] = child.path
        sys.argv = ["-m", *child.args]  # runpy puts the module's file first
        runpy.run_module(child.module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _answer(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the launcher is gone: nothing to tell
        conn.sendall(json.dumps(message).encode() + b"\n")


def receive_request(conn: socket.socket, timeout: float) -> tuple[Any, list[int]]:
    """A launcher's request and the three file descriptors sent with it (length-prefixed JSON), all of
    it within ``timeout``: the server reads one launcher at a time, so one that trickles its request
    holds up the others for ``timeout`` in all, not for ``timeout`` per read."""
    deadline = time.monotonic() + timeout
    fds: list[int] = []
    try:
        conn.settimeout(timeout)
        data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
        if len(fds) != 3:
            raise Refused(f"{len(fds)} file descriptors sent, not 3 (stdin, stdout, stderr)")
        if len(data) < HEADER.size:
            raise Refused("the request ended before its length")
        (size,) = HEADER.unpack_from(data)
        if size > MAX_REQUEST:
            raise Refused(f"a request of {size} bytes (at most {MAX_REQUEST})")
        body = bytearray(data[HEADER.size :])
        while len(body) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            conn.settimeout(left)
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise Refused("the request ended early")
            body += chunk
        try:
            return json.loads(bytes(body[:size])), fds
        except ValueError as exc:
            raise Refused(f"the request is not JSON: {exc}") from None
    except BaseException as exc:
        for fd in fds:
            os.close(fd)
        if isinstance(exc, TimeoutError):  # told, so that its launcher need not guess
            raise Refused(f"the request was not all sent within {timeout:g} s") from None
        raise


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


@dataclass
class _Child:
    pid: int
    pidfd: int
    conn: socket.socket | None  # None once its launcher is gone


class ForkServer:
    """The server's loop: one thread, so that forking is safe; children watched through pidfds."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, _Child] = {}  # by pid
        self.running = True

    def serve(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, self._driver_readable)
        while self.running:
            self._dispatch(None)
        # The driver is gone: so are the queries its children served.
        self.selector.unregister(self.listener)
        self.selector.unregister(sys.stdin.fileno())
        for child in self.children.values():
            _signal(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while self.children and time.monotonic() < deadline:
            self._dispatch(deadline - time.monotonic())
        for child in self.children.values():
            _signal(child.pid, signal.SIGKILL)
            os.waitpid(child.pid, 0)

    def _dispatch(self, timeout: float | None) -> None:
        for key, _ in self.selector.select(timeout):
            key.data(key.fileobj)

    def _driver_readable(self, fd: int) -> None:
        if not os.read(fd, 4096):
            self.running = False  # the driver is gone

    def _accept(self, _: object) -> None:
        try:
            conn, _address = self.listener.accept()
        except OSError:
            return
        conn.settimeout(REQUEST_TIMEOUT)
        try:
            if _peer_uid(conn) != os.getuid():
                raise Refused("a launcher of another user")
            if len(self.children) >= MAX_CHILDREN:
                raise Refused(f"{MAX_CHILDREN} children running already")
            request, streams = receive_request(conn, REQUEST_TIMEOUT)
            try:
                child = plan(request)
                pid = os.fork()
                if pid == 0:
                    self._close_in_child(conn)
                    become(child, streams)
            finally:
                for fd in streams:
                    os.close(fd)
        except Refused as why:
            _answer(conn, {"refused": str(why)})
            conn.close()
            return
        except OSError:
            conn.close()
            return
        pidfd = os.pidfd_open(pid)
        self.children[pid] = _Child(pid, pidfd, conn)
        _answer(conn, {"pid": pid})
        self.selector.register(conn, selectors.EVENT_READ, self._launcher_readable)
        self.selector.register(pidfd, selectors.EVENT_READ, self._exited)

    def _close_in_child(self, conn: socket.socket) -> None:
        self.selector.close()
        self.listener.close()
        conn.close()
        for child in self.children.values():
            os.close(child.pidfd)
            if child.conn is not None:
                child.conn.close()

    def _launcher_readable(self, conn: socket.socket) -> None:
        """Its launcher closed (or wrote, which it never does): it is gone, so is the child."""
        child = next((c for c in self.children.values() if c.conn is conn), None)
        if child is None:
            return  # the child exited earlier in the same select round, which closed this
        self.selector.unregister(conn)
        conn.close()
        child.conn = None
        _signal(child.pid, signal.SIGTERM)

    def _exited(self, pidfd: int) -> None:
        child = next((c for c in self.children.values() if c.pidfd == pidfd), None)
        if child is None:
            return
        _, status = os.waitpid(child.pid, 0)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        del self.children[child.pid]
        if child.conn is not None:
            self.selector.unregister(child.conn)
            _answer(child.conn, {"exit": os.waitstatus_to_exitcode(status)})
            child.conn.close()


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def preload() -> None:
    for module in PRELOAD:
        importlib.import_module(module)
    # The runner itself runs as __main__: left to be loaded from its bytecode (runpy warns about a
    # module it runs that is already imported), its imports stay loaded.
    sys.modules.pop(RUNNER, None)


def main() -> None:
    path = sys.argv[1]
    preload()
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        sys.exit(f"meshplane fork server: {threads} threads after its imports, forking is unsafe: stopped")
    gc.collect()
    gc.freeze()  # what the children inherit stays shared: not written by their collections
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(64)
        ForkServer(listener).serve()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(os.path.dirname(path))


def spawn() -> tuple[subprocess.Popen[bytes], str]:
    """A new fork server and its socket (bound once it has preloaded): it runs until its stdin closes."""
    directory = tempfile.mkdtemp(prefix="meshplane-spark-forkserver-")  # 0700: this user only
    path = os.path.join(directory, "socket")
    server = subprocess.Popen(
        [sys.executable, "-m", "meshplane.spark.forkserver", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,  # it prints nothing: a reader of the driver's output sees its end
        env={**os.environ, **SPARK_WORKER_SETTINGS, **ONE_THREAD},
        start_new_session=True,  # a Ctrl-C in the driver's terminal reaches the driver, not the server
    )
    return server, path


_running: tuple[subprocess.Popen[bytes], str] | None = None


def start() -> str | None:
    """The socket of this process's fork server, spawned on first use; ``None`` where Python cannot
    watch forked children (pidfds: Linux). It exits when this process does (its stdin closes)."""
    global _running
    if _running is None or _running[0].poll() is not None:
        if not hasattr(os, "pidfd_open"):
            return None
        _running = spawn()
    return _running[1]


def running_pid() -> int | None:
    """The pid of this process's fork server, if it runs."""
    return _running[0].pid if _running is not None and _running[0].poll() is None else None


if __name__ == "__main__":
    main()
