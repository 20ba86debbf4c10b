"""The Python that a local Spark session starts for its workers: this interpreter, importing PySpark
from its installed package rather than from the zip Spark puts first on a worker's ``PYTHONPATH``.

Python cannot cache bytecode for a zip, so every Python process Spark starts from it compiles PySpark
anew: about a second here, paid by each query's streaming source runner and each read's planner
(Parquet's JVM source pays nothing of the kind). The zips of a pip-installed PySpark are copies of
the package beside them, so leaving them out imports the same code, compiled once. Anything else on
the path is kept. Installed as the ``meshplane-spark-python`` command; ``spark_session()`` uses it.

Where the driver runs a fork server (forkserver.py: ``MESHPLANE_SPARK_FORKSERVER`` names its socket), a
process Spark starts on its own (``-m`` a module other than the worker daemon, which forks its workers
itself) is forked from it, with PySpark already imported; when it refuses, a fresh Python starts.

This module imports nothing of meshplane or PySpark: it runs before each of Spark's Python processes.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

FORKSERVER_ENV = "MESHPLANE_SPARK_FORKSERVER"  # forkserver.ENV, not imported: see above
DAEMONS = ("pyspark.daemon", "meshplane.spark.daemon")  # long-lived, they fork their own workers
QUIET_DAEMON = "meshplane.spark.daemon"  # daemon.py
CONNECT_TIMEOUT = 2.0  # a fork server that is there accepts at once
ANSWER_TIMEOUT = 15.0  # ... and answers once it forked, later on a loaded machine


def _bundled(entry: str) -> tuple[Path, str] | None:
    """(site-packages, package) of a zip a pip-installed PySpark ships in
    ``<site-packages>/pyspark/python/lib``, else ``None``."""
    zipped = Path(entry)
    lib = zipped.parent
    if (lib.name, lib.parent.name, lib.parent.parent.name) != ("lib", "python", "pyspark"):
        return None
    if zipped.name == "pyspark.zip":
        return lib.parent.parent.parent, "pyspark"
    if zipped.name.startswith("py4j-") and zipped.suffix == ".zip":
        return lib.parent.parent.parent, "py4j"
    return None


def without_bundled_zips(python_path: str, importable_from: list[str]) -> str:
    """``python_path`` without the zips of a PySpark whose packages are importable, as files, from one
    of ``importable_from`` (this interpreter's ``sys.path``)."""
    roots = {os.path.realpath(p) for p in importable_from if p}
    kept = []
    for entry in python_path.split(os.pathsep):
        found = _bundled(entry)
        if found is not None:
            site, package = found
            if os.path.realpath(site) in roots and (site / package / "__init__.py").is_file():
                continue  # imported from the installed package instead
        kept.append(entry)
    return os.pathsep.join(kept)


def _ask(sock: socket.socket, message: bytes, answers: io.BufferedReader) -> bytes:
    """The server's first answer to ``message`` (sent with this process's standard streams), ``b""``
    if it hung up without one. A server that refuses answers, then hangs up: maybe before this process
    wrote all of it (refused by its length), or before the next write, its turn delayed on a loaded
    machine. Such a write fails with a broken pipe; the answer is there to read all the same."""
    try:
        sent = socket.send_fds(sock, [message], [0, 1, 2])
        if sent < len(message):  # sendall(b"") still sends: to a server that hung up, a broken pipe
            sock.sendall(message[sent:])
    except ConnectionError as unsent:  # EPIPE, ECONNRESET: not a timeout, that would wait again
        try:
            line = answers.readline()
        except OSError:
            line = b""
        if not line:
            raise unsent from None
        return line
    return answers.readline()


def run_forked(server: str, argv: list[str]) -> int | None:
    """The exit code of ``python argv`` run as a child of the fork server at ``server``, or ``None`` when
    it did not start one (no server there, or it refused: then it says why on stderr)."""
    request = json.dumps(
        {"executable": sys.executable, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    ).encode()
    message = struct.pack(">I", len(request)) + request
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(server)
    except OSError:
        return None  # no fork server there: Spark's way, silently
    answers = sock.makefile("rb")
    try:
        sock.settimeout(ANSWER_TIMEOUT)
        started = json.loads(_ask(sock, message, answers) or b"{}")
    except (OSError, ValueError) as exc:
        started = {"refused": f"no answer: {exc or type(exc).__name__}"}
    if not isinstance(started, dict) or "pid" not in started:
        reason = started.get("refused", "no answer") if isinstance(started, dict) else "a bad answer"
        print(f"meshplane-spark-python: not forked ({reason}): starting a fresh Python", file=sys.stderr)
        return None
    sock.settimeout(None)  # the child runs as long as it runs; Spark ends it by ending this process
    try:
        return int(json.loads(answers.readline())["exit"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1  # the server is gone, and it ended the child


def with_quiet_daemon(argv: list[str]) -> list[str]:
    """``argv`` with PySpark's worker daemon replaced by meshplane's (daemon.py: the same daemon, without
    the traceback of an idle worker at a session's stop). ``spark.python.daemon.module`` names the
    daemon of the default workers only; Spark starts ``pyspark.daemon`` itself for the others (the Python
    data source lookup, ``pyspark.sql.worker.lookup_data_sources``), whose idle workers print it too."""
    if argv[:2] == ["-m", "pyspark.daemon"]:
        return ["-m", QUIET_DAEMON, *argv[2:]]
    return argv


def _exit_as(code: int) -> None:
    if code < 0:  # the child died of a signal: so does this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def main() -> None:
    path = os.environ.get("PYTHONPATH")
    if path:
        os.environ["PYTHONPATH"] = without_bundled_zips(path, sys.path)
    argv = with_quiet_daemon(sys.argv[1:])
    server = os.environ.get(FORKSERVER_ENV)
    if server and argv[:1] == ["-m"] and argv[1:2] and argv[1] not in DAEMONS:
        code = run_forked(server, argv)
        if code is not None:
            _exit_as(code)
    os.execv(sys.executable, [sys.executable, *argv])
