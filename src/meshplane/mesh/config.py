"""A mesh node's settings (seed 004's names where it has them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from meshplane.core.backpressure import POLICIES, BackpressurePolicy
from meshplane.core.mesh.frames import DEFAULT_MAX_PAYLOAD, check_node_id
from meshplane.core.mesh.router import RouterLimits
from meshplane.errors import ConfigError
from meshplane.mesh.spool import SpoolLimits

SECRET_ENV = "MESHPLANE_MESH_SECRET"
# hold_spooled: guaranteed events are stored and acknowledged but never sent (to kill the node then)
FAULTS = ("drop_sub_add", "duplicate_events", "hold_spooled")


def parse_route(url: str) -> tuple[str, int]:
    """``tcp://host:port`` -> (host, port)."""
    parts = urlsplit(url.strip())
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ConfigError(f"route {url!r}: expected tcp://HOST:PORT")
    return parts.hostname, parts.port


@dataclass
class MeshConfig:
    node_id: str
    cluster: str = "meshplane"
    host: str = "127.0.0.1"
    route_port: int = 0  # routes and mesh clients connect here (0: a free port)
    routes: tuple[str, ...] = ()  # tcp://host:port of the other nodes
    gateways: tuple[tuple[str, str], ...] = ()  # (cluster, tcp://host:port of its gateway): a gateway
    secret: str = field(default_factory=lambda: os.environ.get(SECRET_ENV, ""), repr=False)
    heartbeat_interval: float = 1.0  # also the anti-entropy (digest) interval
    dead_after: float = 3.5  # a link silent this long is closed and dialled again
    reconnect_min: float = 0.05
    reconnect_max: float = 2.0
    handshake_timeout: float = 5.0
    router: RouterLimits = field(default_factory=RouterLimits)
    message_batch_size: int = 256  # frames per write on a link
    message_batch_timeout_ms: float = 0.0  # 0: write once the loop has nothing else to do
    max_message_queue_size: int = 10_000  # per subscriber (client connection, pub/sub listener)
    max_message_queue_bytes: int = 64 * 1024 * 1024
    backpressure_policy: BackpressurePolicy = "drop_oldest"
    link_buffer_bytes: int = 64 * 1024 * 1024  # events to a peer beyond this are dropped, counted
    dedup_per_topic: int = 1000
    dedup_ttl_secs: float = 60.0
    dedup_topics: int = 10_000
    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_clients: int = 10_000
    max_patterns_per_client: int = 10_000
    spool: SpoolLimits = field(default_factory=SpoolLimits)  # guaranteed events per destination node
    faults: frozenset[str] = frozenset()  # fault injection for tests: see FAULTS

    def __post_init__(self) -> None:
        try:
            check_node_id(self.node_id)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.backpressure_policy not in POLICIES:
            raise ConfigError(
                f"backpressure policy {self.backpressure_policy!r}: one of {', '.join(POLICIES)}"
            )
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise ConfigError(f"unknown mesh faults {sorted(unknown)}: {', '.join(FAULTS)}")
        for route in self.routes:
            parse_route(route)
        for cluster, addresses in self.gateways:
            for address in addresses.split(","):
                parse_route(address)
            if cluster == self.cluster:
                raise ConfigError(f"--gateway {cluster}=...: a gateway links to other clusters, not its own")
