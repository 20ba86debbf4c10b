"""Configuration: read from the environment once, overridable in code.

Dynamo's variables keep their names and meanings; meshplane's own knobs are ``MESHPLANE_*``.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from meshplane.context import environment as context_environment
from meshplane.core.brokers import BrokerAddress, parse_broker_url
from meshplane.core.envelope import Codec
from meshplane.core.framing import DEFAULT_MAX_MESSAGE_BYTES, WireFormat
from meshplane.errors import ConfigError

TransportName = Literal["nats", "zmq", "mem", "mesh"]
DiscoveryName = Literal["etcd", "file", "mem"]
SendWhenFull = Literal["drop", "wait"]


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "meshplane"


@dataclass(frozen=True)
class PlaneConfig:
    """Everything a publisher or subscriber needs to know about its deployment."""

    event_plane: TransportName = "nats"
    nats_server: str = "nats://127.0.0.1:4222"
    mesh_node: str = "tcp://127.0.0.1:16500"  # MESHPLANE_NODE: the mesh node a "mesh" plane talks to
    mesh_guaranteed: bool = False  # MESHPLANE_GUARANTEED: a "mesh" publish returns once stored
    mesh_vpn: str = "default"  # MESHPLANE_VPN: the Message VPN a "mesh" plane publishes and subscribes in
    mesh_user: str = ""  # MESHPLANE_MESH_USER: log in to it as this user ($MESHPLANE_MESH_PASSWORD)
    discovery_backend: DiscoveryName = "file"
    file_kv: Path = field(default_factory=lambda: default_state_dir() / "kv")
    file_kv_ttl: float = 10.0  # a file record untouched for this long is expired
    file_kv_poll_interval: float = 0.1
    etcd_endpoints: tuple[str, ...] = ("http://127.0.0.1:2379",)
    etcd_lease_ttl: int = 10
    host: str = "127.0.0.1"
    wire_format: WireFormat = WireFormat.DYNAMO
    codec: Codec = Codec.MSGPACK
    send_hwm: int = 100_000
    receive_hwm: int = 100_000
    # MESHPLANE_SEND_WHEN_FULL, ZeroMQ: when a subscriber's queue is at the high-water mark, "drop" the
    # event for it (PUB semantics, as Dynamo; the subscriber reports a gap) or make publish "wait" until
    # there is room (lossless in direct mode; one stalled subscriber then holds the publisher back; in
    # broker mode it covers the hop to the brokers, whose relays still drop at their own marks)
    send_when_full: SendWhenFull = "drop"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    connect_timeout: float = 5.0
    zmq_brokers: tuple[BrokerAddress, ...] = ()  # DYN_ZMQ_BROKER_URL
    zmq_broker_enabled: bool = False  # DYN_ZMQ_BROKER_ENABLED: brokers from discovery
    broker_fanout: int = 0  # brokers each publisher sends through (HRW choice); 0 = all
    # ZeroMQ CURVE (see meshplane.transports.curve): this process's certificate (the .key_secret file),
    # the folder of public keys it trusts, and the brokers' public key in broker mode.
    # TLS to NATS: the CA that signed the server's certificate, and a client certificate and key for
    # servers that verify clients (nats-server --tlsverify).
    etcd_tls_ca: Path | None = None  # MESHPLANE_ETCD_TLS_CA (also: https:// in ETCD_ENDPOINTS)
    etcd_tls_cert: Path | None = None  # MESHPLANE_ETCD_TLS_CERT
    etcd_tls_key: Path | None = None  # MESHPLANE_ETCD_TLS_KEY
    nats_tls_ca: Path | None = None  # MESHPLANE_NATS_TLS_CA
    nats_tls_cert: Path | None = None  # MESHPLANE_NATS_TLS_CERT
    nats_tls_key: Path | None = None  # MESHPLANE_NATS_TLS_KEY
    mesh_tls_ca: Path | None = None  # MESHPLANE_MESH_TLS_CA: a "mesh" plane's node over TLS
    mesh_tls_cert: Path | None = None  # MESHPLANE_MESH_TLS_CERT
    mesh_tls_key: Path | None = None  # MESHPLANE_MESH_TLS_KEY
    zmq_curve_cert: Path | None = None  # MESHPLANE_ZMQ_CURVE_CERT
    zmq_curve_allowed: Path | None = None  # MESHPLANE_ZMQ_CURVE_ALLOWED
    zmq_curve_broker_key: str | None = None  # MESHPLANE_ZMQ_CURVE_BROKER_KEY (Z85, or a .key file)
    dedup_capacity: int = 65_536  # (publisher, sequence) pairs remembered to drop broker duplicates
    reorder_window: float = 0.5  # seconds an event waits for a missing predecessor on another broker
    heartbeat_period: float = 1.0  # seconds between a publisher's heartbeats; 0 turns them off
    heartbeat_misses: int = 3  # missed periods before a subscriber reports a publisher timed out
    # MESHPLANE_BUSY_POLL, ZeroMQ subscribers: seconds a subscriber keeps asking its socket after a batch
    # before it sleeps in the event loop (lower latency for a core's worth of CPU); 0 = never spin
    busy_poll: float = 0.0
    # MESHPLANE_PUBLISHER_ID: this process's publisher instance name; with the scope and topic it makes
    # each publisher's stable identity, on which rendezvous hashing picks its brokers (default: the host
    # name, and an ordinal among the plane's publishers of one topic)
    publisher_name: str | None = None
    # MESHPLANE_METRICS_PORT: serve the event plane's Prometheus metrics on http://metrics_host:port/metrics
    # (needs prometheus-client, meshplane[streams]); None: no endpoint. MESHPLANE_METRICS_PUBLISHERS:
    # publishers labelled by id per topic (the rest are summed as publisher="other")
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_publishers: int = 20

    @property
    def liveness_timeout(self) -> float:
        """Silence after which a publisher counts as timed out (0: heartbeats are off)."""
        return self.heartbeat_period * self.heartbeat_misses

    @property
    def broker_mode(self) -> bool:
        """ZeroMQ through XSUB/XPUB brokers instead of direct connections."""
        return self.event_plane == "zmq" and (bool(self.zmq_brokers) or self.zmq_broker_enabled)

    def __post_init__(self) -> None:
        if self.event_plane not in ("nats", "zmq", "mem", "mesh"):
            raise ConfigError(
                "DYN_EVENT_PLANE must be 'nats', 'zmq' or 'mesh' (or 'mem', in-process), got "
                f"{self.event_plane!r}"
            )
        if self.discovery_backend not in ("etcd", "file", "mem"):
            raise ConfigError(
                f"DYN_DISCOVERY_BACKEND must be 'etcd', 'file' or 'mem', got {self.discovery_backend!r}"
            )
        for name in ("file_kv_ttl", "file_kv_poll_interval", "connect_timeout", "reorder_window"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("etcd_lease_ttl", "max_message_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("send_hwm", "receive_hwm"):  # 0 is ZeroMQ's "no limit"
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.send_when_full not in ("drop", "wait"):
            raise ConfigError(
                f"MESHPLANE_SEND_WHEN_FULL must be 'drop' or 'wait', got {self.send_when_full!r}"
            )
        if self.heartbeat_period < 0 or self.heartbeat_misses < 1:
            raise ConfigError(
                f"heartbeat_period must be >= 0 and heartbeat_misses >= 1, got {self.heartbeat_period!r} "
                f"and {self.heartbeat_misses!r}"
            )
        if not 0 <= self.busy_poll <= 1:
            raise ConfigError(f"busy_poll must be between 0 and 1 second, got {self.busy_poll!r}")
        if self.dedup_capacity < 1:
            raise ConfigError(f"dedup_capacity must be positive, got {self.dedup_capacity!r}")
        if not self.etcd_endpoints:
            raise ConfigError("ETCD_ENDPOINTS must name at least one endpoint")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"MESHPLANE_METRICS_PORT must be a port (0-65535), got {self.metrics_port!r}")
        if self.metrics_publishers < 0:
            raise ConfigError(f"metrics_publishers must be >= 0, got {self.metrics_publishers!r}")
        if self.publisher_name is not None and not self.publisher_name.strip():
            raise ConfigError("MESHPLANE_PUBLISHER_ID must not be blank")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> PlaneConfig:
        """Read the environment (by default ``os.environ`` over the selected context, see
        :mod:`meshplane.context`); keyword arguments win over it."""
        env = context_environment() if environ is None else environ
        values: dict[str, Any] = {}

        def take(var: str, name: str, convert: Any = str) -> None:
            raw = env.get(var)
            if raw is None or raw == "":
                return
            try:
                values[name] = convert(raw.strip())
            except ConfigError:
                raise
            except (ValueError, KeyError) as exc:
                raise ConfigError(f"{var}={raw!r} is invalid: {exc}") from None

        take("DYN_EVENT_PLANE", "event_plane", str.lower)
        take("NATS_SERVER", "nats_server")
        take("MESHPLANE_NODE", "mesh_node")
        take("MESHPLANE_GUARANTEED", "mesh_guaranteed", _parse_bool)
        take("MESHPLANE_VPN", "mesh_vpn")
        take("MESHPLANE_MESH_USER", "mesh_user")
        take("ETCD_ENDPOINTS", "etcd_endpoints", _split_endpoints)
        if "ETCD_ENDPOINTS" in env and "DYN_DISCOVERY_BACKEND" not in env:
            values["discovery_backend"] = "etcd"
        take("DYN_DISCOVERY_BACKEND", "discovery_backend", str.lower)
        take("DYN_FILE_KV", "file_kv", Path)
        take("ETCD_LEASE_TTL", "etcd_lease_ttl", int)
        take("DYN_EVENT_PLANE_HOST", "host")
        take("MESHPLANE_WIRE_FORMAT", "wire_format", lambda v: WireFormat(v.lower()))
        take("MESHPLANE_CODEC", "codec", lambda v: Codec[v.upper()])
        take("MESHPLANE_SNDHWM", "send_hwm", int)
        take("MESHPLANE_RCVHWM", "receive_hwm", int)
        take("MESHPLANE_SEND_WHEN_FULL", "send_when_full", str.lower)
        take("MESHPLANE_MAX_MESSAGE_BYTES", "max_message_bytes", int)
        take("MESHPLANE_CONNECT_TIMEOUT", "connect_timeout", float)
        take("MESHPLANE_FILE_KV_TTL", "file_kv_ttl", float)
        take("DYN_ZMQ_BROKER_URL", "zmq_brokers", parse_broker_url)
        take("DYN_ZMQ_BROKER_ENABLED", "zmq_broker_enabled", _parse_bool)
        take("MESHPLANE_ZMQ_BROKER_FANOUT", "broker_fanout", int)
        take("MESHPLANE_ETCD_TLS_CA", "etcd_tls_ca", Path)
        take("MESHPLANE_ETCD_TLS_CERT", "etcd_tls_cert", Path)
        take("MESHPLANE_ETCD_TLS_KEY", "etcd_tls_key", Path)
        take("MESHPLANE_NATS_TLS_CA", "nats_tls_ca", Path)
        take("MESHPLANE_NATS_TLS_CERT", "nats_tls_cert", Path)
        take("MESHPLANE_NATS_TLS_KEY", "nats_tls_key", Path)
        take("MESHPLANE_MESH_TLS_CA", "mesh_tls_ca", Path)
        take("MESHPLANE_MESH_TLS_CERT", "mesh_tls_cert", Path)
        take("MESHPLANE_MESH_TLS_KEY", "mesh_tls_key", Path)
        take("MESHPLANE_ZMQ_CURVE_CERT", "zmq_curve_cert", Path)
        take("MESHPLANE_ZMQ_CURVE_ALLOWED", "zmq_curve_allowed", Path)
        take("MESHPLANE_ZMQ_CURVE_BROKER_KEY", "zmq_curve_broker_key")
        take("MESHPLANE_DEDUP_CAPACITY", "dedup_capacity", int)
        take("MESHPLANE_REORDER_WINDOW", "reorder_window", float)
        take("MESHPLANE_HEARTBEAT_PERIOD", "heartbeat_period", float)
        take("MESHPLANE_HEARTBEAT_MISSES", "heartbeat_misses", int)
        take("MESHPLANE_BUSY_POLL", "busy_poll", float)
        take("MESHPLANE_PUBLISHER_ID", "publisher_name")
        take("MESHPLANE_METRICS_PORT", "metrics_port", int)
        take("MESHPLANE_METRICS_HOST", "metrics_host")
        take("MESHPLANE_METRICS_PUBLISHERS", "metrics_publishers", int)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def nats_tls(self) -> ssl.SSLContext | None:
        """The TLS context for NATS, when a CA or client certificate is configured."""
        return _client_tls("NATS", self.nats_tls_ca, self.nats_tls_cert, self.nats_tls_key)

    def mesh_tls(self) -> ssl.SSLContext | None:
        """The TLS context for the mesh node, when a CA or client certificate is configured."""
        return _client_tls("mesh", self.mesh_tls_ca, self.mesh_tls_cert, self.mesh_tls_key)

    def replace(self, **changes: Any) -> PlaneConfig:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def _client_tls(what: str, ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    if ca is None and cert is None:
        return None
    try:
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the {what} TLS files: {exc}") from None
    return context


def _parse_bool(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _split_endpoints(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())
