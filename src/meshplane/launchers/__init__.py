"""Embedded servers: start a real nats-server, etcd or meshplane server as a child process on a free
loopback port. Used by ``meshplane up`` and by the test fixtures. Each server is stopped by PID."""

from meshplane.launchers.base import ServerError, find_binary, free_port
from meshplane.launchers.etcd import EtcdServer
from meshplane.launchers.nats import JetStreamCluster, NatsServer
from meshplane.launchers.servers import BrokerProcess, MeshCluster, StreamsServerProcess

__all__ = [
    "BrokerProcess",
    "EtcdServer",
    "JetStreamCluster",
    "MeshCluster",
    "NatsServer",
    "ServerError",
    "StreamsServerProcess",
    "find_binary",
    "free_port",
]
