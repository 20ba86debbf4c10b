"""meshplane's own servers as child processes: a ZeroMQ broker, the streams server, a mesh cluster."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from meshplane.core.brokers import BrokerAddress
from meshplane.launchers.base import (
    Cluster,
    ServerError,
    ServerProcess,
    free_port,
)


class BrokerProcess(ServerProcess):
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

    def start(self, timeout: float = 20.0, *, ready: bool = True) -> BrokerProcess:
        """Start the broker and (``ready``) wait until it listens; several started with
        ``ready=False``, then :meth:`wait_ready` on each, boot at once."""
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
        self._spawn(argv, self._env)
        return self.wait_ready(timeout) if ready else self

    def wait_ready(self, timeout: float = 20.0) -> BrokerProcess:
        assert self.proc is not None
        addresses = self._ready_line(self.proc, timeout, "broker")
        # Restarts reuse the ports the first start picked.
        self.xsub, self.xpub, self.stats_endpoint = addresses["xsub"], addresses["xpub"], addresses["stats"]
        return self


class StreamsServerProcess(ServerProcess):
    """``meshplane serve`` as a child process; restarts keep the port and the data directory."""

    def __init__(
        self,
        port: int = 0,
        data_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.port = port
        self.data_dir = data_dir or self.workdir / "data"
        self.url = ""
        self.announced: dict[str, Any] = {}
        named = {arg.split("=", 1)[0] for arg in extra_args if arg.startswith("--")}  # --flag v, --flag=v
        if "--node-id" in named and not {"--route-port", "--config"} & named:
            # A mesh node's routes on a free port, as its HTTP port: two nodes started side by side
            # would both take the default (16500). A restart keeps the port it got.
            extra_args = (*extra_args, "--route-port", "0")
        self._extra_args = extra_args
        self._env = env  # added to this process's environment (tokens go there, never on argv)
        self._launcher = launcher  # e.g. ("ip", "netns", "exec", NAME): the server in a network namespace

    def start(self, timeout: float = 20.0, *, ready: bool = True) -> StreamsServerProcess:
        """Start the server and (``ready``) wait until it listens; a ``--standby`` server listens
        only once it has taken over: start it with ``ready=False`` and :meth:`wait_ready` later."""
        self.log_path.write_bytes(b"")
        argv = [
            *self._launcher,
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
        self._extra_args = self._pinned(self._extra_args)
        return self

    def _pinned(self, args: tuple[str, ...]) -> tuple[str, ...]:
        """``args`` with each port given as 0 replaced by the one the server got: a restart takes
        the same addresses, as peers and clients know them."""
        mesh = self.announced.get("mesh", {})
        got = {
            "--route-port": int(mesh["route_url"].rsplit(":", 1)[1]) if mesh else None,
            "--mqtt-port": mesh.get("mqtt_port"),
            "--mqtt-ws-port": mesh.get("mqtt_ws_port"),
            "--nats-port": mesh.get("nats_port"),
        }
        pinned = list(args)
        for i, (flag, value) in enumerate(itertools.pairwise(args)):
            if value == "0" and got.get(flag) is not None:
                pinned[i + 1] = str(got[flag])
        return tuple(pinned)

    def door_port(self, door: str) -> int:
        """The port of the node's ``mqtt``, ``mqtt_ws`` or ``nats`` door, as its ready line said."""
        return int(self.announced["mesh"][f"{door}_port"])

    @property
    def route_url(self) -> str:
        """The mesh node's route address (servers started with --node-id)."""
        return str(self.announced["mesh"]["route_url"])


class MeshCluster(Cluster[StreamsServerProcess]):
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
        # Every node booting at once (their route ports are fixed up front): a 3-node cluster is up
        # in about half the time of one node after another.
        for node in self.nodes:
            node.start(timeout, ready=False)
        for node in self.nodes:
            node.wait_ready(timeout)
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
