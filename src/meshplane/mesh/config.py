"""A mesh node's settings (seed 004's names where it has them)."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from meshplane.core.backpressure import POLICIES, BackpressurePolicy
from meshplane.core.mesh.frames import DEFAULT_MAX_PAYLOAD, check_node_id
from meshplane.core.mesh.router import RouterLimits
from meshplane.errors import ConfigError
from meshplane.mesh.spool import SpoolLimits
from meshplane.mesh.vpns import Vpns

SECRET_ENV = "MESHPLANE_MESH_SECRET"  # one secret for members and clients alike: an earlier release's
MEMBER_SECRET_ENV = "MESHPLANE_MESH_MEMBER_SECRET"  # what nodes, gateways and HA mates prove
CLIENT_SECRET_ENV = "MESHPLANE_MESH_CLIENT_SECRET"  # what mesh clients prove


def secret_from_env(name: str) -> str:
    """``name``'s secret, else the single secret of an earlier release (``MESHPLANE_MESH_SECRET``)."""
    return os.environ.get(name) or os.environ.get(SECRET_ENV, "")


# hold_spooled: guaranteed events are stored and acknowledged but never sent (to kill the node then)
# no_interest_batches: the node neither takes nor sends INTEREST frames (as nodes before them)
FAULTS = ("drop_sub_add", "duplicate_events", "hold_spooled", "no_interest_batches")


def parse_route(url: str) -> tuple[str, int]:
    """``tcp://host:port`` -> (host, port)."""
    parts = urlsplit(url.strip())
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ConfigError(f"route {url!r}: expected tcp://HOST:PORT")
    return parts.hostname, parts.port


@dataclass(frozen=True)
class MeshTls:
    """TLS 1.3 on a node's links and client connections: its certificate and key, and the CA that
    signs its peers' (with ``ca``, every connection must present a certificate it signed, and a route's
    or gateway's must name the node id or cluster its HELLO claims)."""

    cert: Path
    key: Path
    ca: Path | None = None

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        return self._load(context, ssl.CERT_REQUIRED if self.ca else ssl.CERT_NONE)

    def client_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        # Peers are named by node id, not host name: the id is checked against the certificate after
        # HELLO (a route to 10.0.0.5 is node "b" if its certificate says "b").
        context.check_hostname = False
        return self._load(context, ssl.CERT_REQUIRED if self.ca else ssl.CERT_NONE)

    def _load(self, context: ssl.SSLContext, verify: ssl.VerifyMode) -> ssl.SSLContext:
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        try:
            context.load_cert_chain(self.cert, self.key)
            if self.ca is not None:
                context.load_verify_locations(cafile=self.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"mesh TLS: cannot load {self.cert}, {self.key} or {self.ca}: {exc}") from None
        context.verify_mode = verify
        return context


@dataclass(frozen=True)
class PeerLimits:
    """What one connection can make a node hold or spend (docs/security.md); passing a limit closes
    that connection with a counted reason (``closed_<reason>`` in ``GET /mesh``)."""

    max_routes: int = 256  # route peers a node remembers (a Link and a ~120 KB Bloom filter each)
    max_partial_bytes: int = 64 * 1024 * 1024  # frames not yet whole, all connections together
    max_patterns_per_peer: int = 100_000  # interest one route or gateway may advertise
    max_pending_bytes: int = 96 * 1024 * 1024  # queued for one connection, unread by its peer
    max_pings_per_client: int = 1000  # propagated pings of one client waiting for the peers
    ping_timeout: float = 10.0  # a propagated ping is answered after this long whatever the peers do
    frame_timeout: float = 10.0  # seconds to finish a frame once it has begun
    idle_timeout: float = 120.0  # seconds a connection may send nothing at all (clients ping)
    auth_timeout: float = 2.0  # seconds an accepted connection has for TLS and its proof
    max_unauthenticated: int = 256  # accepted connections not yet proven, in all
    max_unauthenticated_per_address: int = 32  # ... from one source address


@dataclass
class MeshConfig:
    node_id: str
    cluster: str = "meshplane"
    host: str = "127.0.0.1"
    route_port: int = 0  # routes and mesh clients connect here (0: a free port)
    nats_port: int | None = None  # NATS clients connect here (0: a free port; None: no NATS door)
    routes: tuple[str, ...] = ()  # tcp://host:port of the other nodes
    mqtt_port: int | None = None  # MQTT clients connect here (None: no MQTT door; 0: a free port)
    mqtt_ws_port: int | None = None  # MQTT over WebSocket (None: none; 0: a free port)
    mqtt_session_expiry: int = 7 * 24 * 3600  # seconds a persistent MQTT session outlives its client
    gateways: tuple[tuple[str, str], ...] = ()  # (cluster, tcp://host:port of its gateway): a gateway
    secret: str = field(default_factory=lambda: secret_from_env(MEMBER_SECRET_ENV), repr=False)  # members'
    client_secret: str | None = field(default=None, repr=False)  # None: $MESHPLANE_MESH_CLIENT_SECRET
    heartbeat_interval: float = 1.0  # also the anti-entropy (digest) interval
    dead_after: float = 3.5  # a link silent this long is closed and dialled again
    reconnect_min: float = 0.05
    reconnect_max: float = 2.0
    handshake_timeout: float = 5.0
    router: RouterLimits = field(default_factory=RouterLimits)
    max_queues: int = 10_000  # guaranteed queues this node keeps (each an open file)
    message_batch_size: int = 256  # frames per write on a link
    message_batch_timeout_ms: float = 0.0  # 0: write once the loop has nothing else to do
    # Per mesh client. The bytes (each frame charged its Python overhead too) bind first at defaults,
    # as nats-server's 64 MB max_pending: a burst to a subscriber held back briefly waits, whole.
    max_message_queue_size: int = 1_000_000
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
    limits: PeerLimits = field(default_factory=PeerLimits)
    tls: MeshTls | None = None  # routes, gateways and clients over TLS (with its CA: mutual)
    vpns: Vpns = field(default_factory=Vpns)  # Message VPNs (--mesh-vpns FILE); "default" always
    vpns_file: Path | None = None  # ... read again on SIGHUP (mesh/vpn_reload.py)
    faults: frozenset[str] = frozenset()  # fault injection for tests: see FAULTS

    @property
    def one_secret(self) -> bool:
        """Members and clients prove the same secret: a client could link as a member (an earlier
        release's single secret, accepted for one more release)."""
        return bool(self.secret) and self.secret == self.client_secret

    def __post_init__(self) -> None:
        if self.client_secret is None:
            self.client_secret = (
                os.environ.get(CLIENT_SECRET_ENV) or os.environ.get(SECRET_ENV) or self.secret
            )
        if self.client_secret and not self.secret:
            raise ConfigError(
                f"${CLIENT_SECRET_ENV} is set but the members' secret is not: nodes, gateways and HA "
                f"mates would prove nothing and anyone could link as one; set ${MEMBER_SECRET_ENV} too"
            )
        if self.max_queues < 0:
            raise ConfigError(f"max_queues must be >= 0, not {self.max_queues}")
        try:
            check_node_id(self.node_id)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.backpressure_policy not in POLICIES:
            raise ConfigError(
                f"backpressure policy {self.backpressure_policy!r}: one of {', '.join(POLICIES)}"
            )
        if self.mqtt_session_expiry < 0:
            raise ConfigError(f"MQTT session expiry {self.mqtt_session_expiry}: seconds, 0 or more")
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


def parse_node_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url.strip())
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ConfigError(f"mesh node {url!r}: expected tcp://HOST:PORT (MESHPLANE_NODE)")
    return parts.hostname, parts.port


def parse_node_urls(text: str) -> list[tuple[str, int]]:
    """``tcp://HOST:PORT[,tcp://HOST:PORT...]``: a node, or the mates of an HA pair (tried in turn)."""
    return [parse_node_url(url) for url in text.split(",") if url.strip()] or [parse_node_url(text)]
