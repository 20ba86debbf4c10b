"""The event mesh on the command line: ``serve``'s node options (``mesh status`` renders in tables.py)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from meshplane.core.backpressure import POLICIES
from meshplane.core.mesh.router import RouterLimits
from meshplane.mesh.config import FAULTS, MeshConfig, MeshTls, PeerLimits
from meshplane.mesh.spool import SpoolLimits
from meshplane.mesh.vpns import Vpns, load_vpns
from meshplane.streams.config import StreamsConfig

DEFAULT_ROUTE_PORT = 16500


def add_mesh_options(parser: argparse.ArgumentParser) -> None:
    mesh = parser.add_argument_group(
        "event mesh (with --node-id: this server is a node; --routes links it to the others of its cluster)"
    )
    mesh.add_argument(
        "--node-id", metavar="ID", help="this node's id (1-16 ASCII characters); turns the mesh on"
    )
    mesh.add_argument("--cluster", default="meshplane", help="cluster name: links only join equal names")
    mesh.add_argument(
        "--routes",
        type=_routes,
        default=(),
        metavar="URL,...",
        help="the other nodes' route addresses, tcp://HOST:PORT, comma-separated",
    )
    mesh.add_argument(
        "--gateway",
        action="append",
        type=_gateway,
        default=[],
        metavar="CLUSTER=tcp://HOST:PORT",
        help="make this node its cluster's gateway, with an external link to CLUSTER's gateway at that "
        "route address (repeat for each cluster; both gateways name each other)",
    )
    mesh.add_argument(
        "--route-port",
        type=int,
        default=DEFAULT_ROUTE_PORT,
        metavar="PORT",
        help=f"where other nodes and mesh clients (MESHPLANE_NODE) connect (default {DEFAULT_ROUTE_PORT}; "
        "0: a free one). Secrets, if any: $MESHPLANE_MESH_MEMBER_SECRET and $MESHPLANE_MESH_CLIENT_SECRET",
    )
    mesh.add_argument(
        "--mqtt-port",
        type=int,
        default=None,
        metavar="PORT",
        help="open the MQTT door: MQTT 3.1.1 and 5 clients connect here (on --host; 0: a free port). "
        "VPN users log in as USER@VPN; else the password must be $MESHPLANE_MQTT_TOKEN when it is set",
    )
    defaults = MeshConfig(node_id="x")
    mesh.add_argument(
        "--heartbeat-interval",
        type=float,
        default=defaults.heartbeat_interval,
        metavar="S",
        help="seconds between heartbeats and interest digests on each link; a link silent 3.5 times as long "
        "is closed and dialled again",
    )
    mesh.add_argument(
        "--bloom-filter-capacity",
        type=int,
        default=RouterLimits.bloom_filter_capacity,
        metavar="N",
        help="patterns per peer each filter is sized for",
    )
    mesh.add_argument(
        "--bloom-filter-fpr",
        type=float,
        default=RouterLimits.bloom_filter_fpr,
        metavar="P",
        help="the filters' false-positive rate at capacity",
    )
    mesh.add_argument(
        "--mesh-max-queues",
        type=int,
        default=defaults.max_queues,
        metavar="N",
        help=f"guaranteed queues this node keeps, at most (default {defaults.max_queues:,}; "
        "each is an open file; a VPN's max_queues caps its own)",
    )
    mesh.add_argument(
        "--message-batch-size",
        type=int,
        default=defaults.message_batch_size,
        metavar="N",
        help="frames written to a link at once, at most",
    )
    mesh.add_argument(
        "--message-batch-timeout-ms",
        type=float,
        default=defaults.message_batch_timeout_ms,
        metavar="MS",
        help="longest a frame waits for its batch (default 0: until the loop is idle)",
    )
    mesh.add_argument(
        "--max-message-queue-size",
        type=int,
        default=None,
        metavar="N",
        help="messages queued per subscriber (mesh client, pub/sub WebSocket) before the policy applies "
        f"(default: {defaults.max_message_queue_size:,} for a mesh client, whose "
        f"{defaults.max_message_queue_bytes >> 20} MB bound binds first, as nats-server's max_pending; "
        "10,000 for a pub/sub WebSocket)",
    )
    mesh.add_argument(
        "--backpressure-policy",
        choices=POLICIES,
        default=None,
        help="what a full subscriber queue does (default: drop_oldest for mesh clients, drop_newest for "
        "pub/sub listeners)",
    )
    mesh.add_argument(
        "--spool-max-bytes",
        type=int,
        default=defaults.spool.max_bytes,
        metavar="N",
        help="guaranteed events kept for one unreachable node, in bytes; beyond, publishes are refused",
    )
    mesh.add_argument(
        "--spool-max-events",
        type=int,
        default=defaults.spool.max_events,
        metavar="N",
        help="guaranteed events kept for one unreachable node; beyond, publishes are refused",
    )
    mesh.add_argument("--mesh-fault", action="append", choices=FAULTS, default=[], help=argparse.SUPPRESS)
    mesh.add_argument(
        "--mesh-tls-cert", type=Path, metavar="PEM", help="TLS 1.3 on routes, gateways and clients"
    )
    mesh.add_argument("--mesh-tls-key", type=Path, metavar="PEM", help="... with this private key")
    mesh.add_argument(
        "--mesh-tls-ca",
        type=Path,
        metavar="PEM",
        help="... and require every peer's certificate signed by this CA (a route's or gateway's must "
        "name the node id or cluster it claims)",
    )
    mesh.add_argument(
        "--mesh-vpns",
        type=Path,
        metavar="TOML",
        help="Message VPNs: a file of [vpns.NAME] sections (the same on every node); clients name "
        "theirs, and no event, interest or queue crosses from one VPN to another; read again on SIGHUP "
        "(`meshplane vpn check FILE` first)",
    )
    nats = parser.add_argument_group("NATS door (NATS clients, unchanged, on this node; docs/mesh.md)")
    nats.add_argument(
        "--nats-port",
        type=int,
        default=None,
        metavar="PORT",
        help="take NATS clients here, on --host (0: a free port). Credentials: the --mesh-vpns users, "
        "else $MESHPLANE_NATS_TOKEN if set",
    )
    mqtt = parser.add_argument_group("MQTT door (MQTT clients, unchanged, on this node; docs/mesh.md)")
    mqtt.add_argument(
        "--mqtt-ws-port",
        type=int,
        default=None,
        metavar="PORT",
        help="take MQTT over WebSocket here too (on --host; 0: a free port; wss with the node's TLS): the "
        'subprotocol "mqtt", binary messages, any path; the same clients, rules and limits as --mqtt-port',
    )
    mqtt.add_argument(
        "--mqtt-session-expiry",
        type=int,
        default=MeshConfig.mqtt_session_expiry,
        metavar="S",
        help="seconds a persistent MQTT session (its subscriptions, its queue) outlives its client: 3.1.1's "
        "sessions, and the most an MQTT 5 client's Session Expiry Interval gets (0: no persistent sessions; "
        "as mosquitto's persistent_client_expiration)",
    )
    limits = parser.add_argument_group("mesh limits per connection (passing one closes that connection)")
    for name, (kind, help_text) in PEER_LIMIT_FLAGS.items():
        default = getattr(PeerLimits(), name)
        limits.add_argument(
            f"--mesh-{name.replace('_', '-')}",
            dest=f"mesh_{name}",
            type=kind,
            default=default,
            metavar="N",
            help=f"{help_text} (default {default})",
        )


PEER_LIMIT_FLAGS: dict[str, tuple[type, str]] = {
    "max_routes": (int, "route peers a node remembers"),
    "max_partial_bytes": (int, "bytes of frames not yet whole, all connections together"),
    "max_patterns_per_peer": (int, "patterns one route or gateway may advertise"),
    "max_pending_bytes": (int, "bytes queued for one connection that its peer has not read"),
    "max_pings_per_client": (int, "propagated pings of one client waiting for the peers"),
    "ping_timeout": (float, "seconds before a propagated ping is answered whatever the peers do"),
    "frame_timeout": (float, "seconds a connection may take to finish a frame"),
    "idle_timeout": (float, "seconds a mesh connection may send nothing (0: no limit)"),
    "auth_timeout": (float, "seconds an accepted connection has to prove itself (again: its first record)"),
    "max_unauthenticated": (int, "accepted connections not yet proven, in all (more are closed at once)"),
    "max_unauthenticated_per_address": (int, "accepted connections not yet proven from one address"),
}


def _gateway(text: str) -> tuple[str, str]:
    cluster, sep, address = text.partition("=")
    if not sep or not cluster.strip() or not address.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected CLUSTER=tcp://HOST:PORT")
    return cluster.strip(), address.strip()


def _routes(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def mesh_config_from_args(args: argparse.Namespace) -> MeshConfig | None:
    if args.node_id is None:  # --routes without it is refused before: serve_rules.py
        return None
    policy: dict[str, Any] = (
        {"backpressure_policy": args.backpressure_policy} if args.backpressure_policy else {}
    )
    return MeshConfig(
        node_id=args.node_id,
        cluster=args.cluster,
        host=args.host,
        route_port=args.route_port,
        nats_port=args.nats_port,
        routes=args.routes,
        mqtt_port=args.mqtt_port,
        mqtt_ws_port=args.mqtt_ws_port,
        mqtt_session_expiry=args.mqtt_session_expiry,
        gateways=tuple(args.gateway),
        heartbeat_interval=args.heartbeat_interval,
        dead_after=args.heartbeat_interval * 3.5,
        router=RouterLimits(
            bloom_filter_capacity=args.bloom_filter_capacity, bloom_filter_fpr=args.bloom_filter_fpr
        ),
        max_queues=args.mesh_max_queues,
        message_batch_size=args.message_batch_size,
        message_batch_timeout_ms=args.message_batch_timeout_ms,
        max_message_queue_size=args.max_message_queue_size or MeshConfig.max_message_queue_size,
        spool=SpoolLimits(max_bytes=args.spool_max_bytes, max_events=args.spool_max_events),
        faults=frozenset(args.mesh_fault),
        limits=PeerLimits(**{name: getattr(args, f"mesh_{name}") for name in PEER_LIMIT_FLAGS}),
        tls=_mesh_tls(args),
        vpns=load_vpns(args.mesh_vpns) if args.mesh_vpns is not None else Vpns(),
        vpns_file=args.mesh_vpns,
        **policy,
    )


def _mesh_tls(args: argparse.Namespace) -> MeshTls | None:
    if args.mesh_tls_cert is None or args.mesh_tls_key is None:  # one without the other: serve_rules.py
        return None
    return MeshTls(args.mesh_tls_cert, args.mesh_tls_key, args.mesh_tls_ca)


def with_pubsub_backpressure(config: StreamsConfig, args: argparse.Namespace) -> StreamsConfig:
    """The pub/sub listeners follow the node's queue settings when they are given."""
    if args.node_id is None:
        return config
    changes: dict[str, Any] = {}
    if args.max_message_queue_size:
        changes["pubsub_queue_size"] = args.max_message_queue_size
    if args.backpressure_policy:
        changes["pubsub_backpressure"] = args.backpressure_policy
    return dataclasses.replace(config, **changes)
