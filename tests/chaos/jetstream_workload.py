"""A topic on JetStream R3: three nats-servers (n1, n2, n3: one JetStream cluster, each store on its
host's lossy disk) and a streams server on a fourth host (s) keeping its topics there with three
replicas. The producers and the checks are the local topic's (:mod:`.topics_workload`); the faults
fall on the nats-servers, a coordinated power failure of all three included. ``--fsync always`` sets
nats-server's ``sync_interval: always``; any other leaves nats-server's default (fsync every two
minutes), whose loss under power failure this measures."""

from __future__ import annotations

from meshplane.launchers.base import ServerProcess, find_binary, wait_for_port
from tests.chaos.harness import Server, Servers, Workload, streams_server
from tests.chaos.schedule import NEMESES
from tests.chaos.topics_workload import topic_run

NATS = ("n1", "n2", "n3")
CLIENT_PORT, ROUTE_PORT = 4222, 6222


class NatsHost(ServerProcess):
    """nats-server on a host of the harness, one of the cluster's three."""

    def __init__(self, servers: Servers, host: str, sync_always: bool) -> None:
        super().__init__()
        self.address = servers.network.address(host)
        self.host_name = host
        self.routes = [
            f"nats://{servers.network.address(peer)}:{ROUTE_PORT}" for peer in NATS if peer != host
        ]
        self.launcher = servers.network.exec_prefix(host)
        self.store = servers.mount(host) / "jetstream"
        self.sync = ", sync_interval: always" if sync_always else ""

    def start(self, timeout: float = 30.0) -> NatsHost:
        config = self.workdir / "server.conf"
        config.write_text(f'jetstream {{ store_dir: "{self.store}"{self.sync} }}\n')
        argv = [
            *self.launcher,
            *(find_binary("nats-server"), "-a", self.address, "-p", str(CLIENT_PORT)),
            *("--server_name", self.host_name, "--cluster_name", "js"),
            *("--cluster", f"nats://{self.address}:{ROUTE_PORT}", "--routes", ",".join(self.routes)),
            *("-c", str(config)),
        ]
        wait_for_port(self.address, CLIENT_PORT, self._spawn(argv), timeout, self.log_path)
        return self


def server(servers: Servers, host: str, fsync: str) -> Server:
    if host in NATS:
        return NatsHost(servers, host, fsync == "always")
    storage = ",".join(f"nats://{servers.network.address(n)}:{CLIENT_PORT}" for n in NATS)
    return streams_server(lambda s, h: ("--storage", storage, "--replicas", "3"))(servers, host, fsync)


WORKLOAD = Workload(
    (*NATS, "s"),
    tuple(kind for kind in NEMESES if kind != "cap"),
    server,
    topic_run("s", {"num_partitions": 1}),
    targets=NATS,
    waves=(NATS,),
)
