"""``meshplane serve``: the streams server (and, with ``--node-id``, a mesh node) from its flags."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplane.cli.heap import settle_heap
from meshplane.cli.streams import TOKEN_ENV, require_streams_extra
from meshplane.config import default_state_dir
from meshplane.errors import ConfigError
from meshplane.streams.access import Tokens
from meshplane.streams.lock import DataDirLock
from meshplane.streams.service import StreamsConfig, StreamsService

if TYPE_CHECKING:
    from meshplane.mesh.config import MeshConfig
    from meshplane.mesh.lease import MateLease
    from meshplane.mesh.vpns import Vpns

STORAGE_ENV = "MESHPLANE_STREAMS_STORAGE"


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=15500, help="port (default 15500, Synap's; 0: a free one)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=default_state_dir() / "streams",
        help="where logs and metadata live (default ~/.local/state/meshplane/streams)",
    )
    parser.add_argument(
        "--storage",
        default=os.environ.get(STORAGE_ENV, "local"),
        metavar="local|nats://HOST:PORT[,...]",
        help="where topics and consumer groups live: this server's --data-dir (local, the default), or "
        "a NATS JetStream cluster shared by several servers (rooms stay local). "
        f"${STORAGE_ENV} sets it too (put credentials there, not on the command line)",
    )
    parser.add_argument(
        "--storage-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="with --storage nats://: how long start-up waits for JetStream (servers not up yet, no leader "
        "yet), saying so every 5 s (default 60)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="with --storage nats://: replicas of each partition and of the groups (default 1)",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="if another server holds --data-dir, wait and take over when it stops (an HA mate: same "
        "--data-dir and --node-id, its own ports)",
    )
    parser.add_argument(
        "--mates-etcd",
        metavar="URL[,URL...]",
        help="HA mates on separate machines (with --node-id): each mate its own --data-dir, the active "
        "mirrors it to the standby, and etcd at these endpoints holds the lease that says which is active "
        "(TLS: the MESHPLANE_ETCD_TLS_* variables). Start the other mate with the same --node-id",
    )
    parser.add_argument(
        "--mate-lease-secs",
        type=int,
        default=3,
        metavar="S",
        help="with --mates-etcd: a paused or cut-off active loses the lease within S seconds (default 3)",
    )
    parser.add_argument(
        "--mate-ack-timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="with --mates-etcd: a standby that has not applied a change within S seconds is dropped, "
        "and the active acknowledges alone until it has caught up again (default 2)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require tokens: one a line, each with its scopes (read, write, admin, optionally :PREFIX; "
        "none: admin) and optionally vpn:NAME, a VPN of --mesh-vpns (a FILE.toml: [tokens.NAME] sections "
        f"of token, vpn, scopes). ${TOKEN_ENV} adds one admin token. Neither: no auth",
    )
    parser.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate")
    parser.add_argument("--tls-key", type=Path, metavar="PEM", help="... and this private key")
    parser.add_argument(
        "--fsync",
        choices=["always", "interval", "never"],
        default="interval",
        help="always: acknowledge after fsync (group commit); interval: fsync every "
        "--fsync-interval-ms; never: leave it to the OS (default interval)",
    )
    parser.add_argument(
        "--fsync-interval-ms",
        type=float,
        default=10.0,
        metavar="MS",
        help="with --fsync interval: milliseconds between fsyncs (default 10)",
    )
    parser.add_argument(
        "--fsync-every-records",
        type=int,
        default=0,
        metavar="N",
        help="with --fsync interval: also fsync once N records wait (default 0: off)",
    )
    parser.add_argument(
        "--segment-bytes",
        type=int,
        default=64 * 1024 * 1024,
        metavar="N",
        help="default segment size of new topics and rooms",
    )
    parser.add_argument(
        "--max-payload-bytes",
        type=int,
        default=1024 * 1024,
        metavar="N",
        help="largest event accepted (413 beyond)",
    )
    parser.add_argument(
        "--room-max-events",
        type=int,
        default=10_000,
        metavar="N",
        help="events a room keeps (its ring buffer)",
    )
    parser.add_argument(
        "--room-retention-secs",
        type=float,
        default=24 * 3600.0,
        metavar="S",
        help="how long rooms keep events by default (default one day)",
    )
    parser.add_argument("--no-auto-create", action="store_true", help="rooms must be created before use")
    limits = parser.add_argument_group("limits (each visible in /metrics and GET /storage)")
    defaults = StreamsConfig()
    for flag, kind, help_text in (
        ("--max-topics", int, "topics"),
        ("--max-partitions", int, "partitions of all topics together"),
        ("--max-rooms", int, "rooms"),
        ("--max-groups", int, "consumer groups"),
        ("--room-memory-bytes", int, "memory for all rooms' histories together"),
        ("--max-open-files", int, "segment files open at once (default: half of RLIMIT_NOFILE)"),
        ("--idempotency-ttl-secs", float, "how long an idempotent publish is remembered"),
        ("--staging-max-stages", int, "staged writes (a Spark task attempt's rows before its commit)"),
        ("--staging-max-bytes", int, "bytes of staged writes on disk"),
        ("--staging-ttl-secs", float, "seconds an untouched staged write is kept (its writer died)"),
        ("--idle-timeout", float, "seconds a connection may take to send a whole request"),
        ("--body-timeout", float, "seconds a request body may take to arrive (then 408)"),
        ("--push-keepalive", float, "seconds between keep-alive comments to idle SSE subscribers"),
    ):
        field_name = _CONFIG_FIELDS[flag]
        default = getattr(defaults, field_name)
        limits.add_argument(
            flag,
            type=kind,
            default=default,
            metavar="N",
            help=f"{help_text} (default {default})" if default is not None else help_text,
        )


def streams_engine(args: argparse.Namespace, mesh_config: MeshConfig | None) -> StreamsService:
    from meshplane.cli.mesh import with_pubsub_backpressure

    config = with_pubsub_backpressure(streams_config_from_args(args), args)
    if args.storage == "local":
        return StreamsService(config)
    servers = [url.strip() for url in args.storage.split(",") if url.strip()]  # checked: serve_rules.py
    from meshplane.streams.jetstream.service import JetStreamStreamsService

    def progress(line: str) -> None:
        print(f"meshplane serve: {line}", file=sys.stderr, flush=True)

    return JetStreamStreamsService(
        config, servers, replicas=args.replicas, start_timeout=args.storage_timeout, progress=progress
    )


def server_vpns(path: Path | None) -> Vpns:
    """The Message VPNs of a --mesh-vpns file (only ``default`` without one)."""
    from meshplane.mesh.vpns import Vpns, load_vpns

    return load_vpns(path) if path is not None else Vpns()


def streams_config_from_args(args: argparse.Namespace) -> StreamsConfig:
    return StreamsConfig(
        data_dir=args.data_dir,
        fsync=args.fsync,
        fsync_interval_ms=args.fsync_interval_ms,
        fsync_every_records=args.fsync_every_records,
        segment_bytes=args.segment_bytes,
        max_payload_bytes=args.max_payload_bytes,
        room_max_events=args.room_max_events,
        room_retention_secs=args.room_retention_secs,
        auto_create_rooms=not args.no_auto_create,
        **{field: getattr(args, flag[2:].replace("-", "_")) for flag, field in _CONFIG_FIELDS.items()},
    )


_CONFIG_FIELDS = {  # serve's flag -> StreamsConfig field
    "--max-topics": "max_topics",
    "--max-partitions": "max_partitions",
    "--max-rooms": "max_rooms",
    "--max-groups": "max_groups",
    "--room-memory-bytes": "room_memory_bytes",
    "--max-open-files": "max_open_files",
    "--idempotency-ttl-secs": "idempotency_ttl_secs",
    "--staging-max-stages": "staging_max_stages",
    "--staging-max-bytes": "staging_max_bytes",
    "--staging-ttl-secs": "staging_ttl_secs",
    "--idle-timeout": "idle_timeout_secs",
    "--body-timeout": "body_timeout_secs",
    "--push-keepalive": "push_keepalive_secs",
}


async def run_serve(args: argparse.Namespace) -> int:
    require_streams_extra()
    from meshplane.cli.mesh import mesh_config_from_args
    from meshplane.streams.http.app import server_tls

    try:  # settings that go together are checked before: serve_rules.py
        tls = server_tls(args.tls_cert, args.tls_key) if args.tls_cert else None
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate or key: {exc}") from None
    mesh_config = mesh_config_from_args(args)
    # A token's VPN is one of the --mesh-vpns file's (the streams side's too, with or without a mesh).
    vpns = mesh_config.vpns if mesh_config is not None else server_vpns(args.mesh_vpns)
    tokens = Tokens.load(args.token_file, os.environ.get(TOKEN_ENV), vpns)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lock = DataDirLock(args.data_dir)
    if args.mates_etcd and mesh_config is not None:
        lock.acquire()
        try:
            return await _serve_as_mate(args, tokens, tls, mesh_config, stop)
        finally:
            lock.release()
    if not args.standby:
        lock.acquire()
    elif not lock.try_acquire():
        print(
            f"standby: {args.data_dir} is held by pid {lock.holder()}; taking over when it stops",
            file=sys.stderr,
            flush=True,
        )
        if not await lock.wait(stop):
            return 0
    try:
        return await _serve_locked(args, tokens, tls, mesh_config, stop)
    finally:
        lock.release()


async def _serve_as_mate(
    args: argparse.Namespace,
    tokens: Tokens | None,
    tls: ssl.SSLContext | None,
    mesh_config: MeshConfig,
    stop: asyncio.Event,
) -> int:
    """Standby until etcd's lease is this mate's, then active until it is lost (then standby again)."""
    from meshplane.cli.mates import mate_lease
    from meshplane.mesh.mates import mate_token
    from meshplane.mesh.standby import Standby
    from meshplane.streams.mirror import DirectoryReplica

    named = (args.mates_etcd, mesh_config.cluster, mesh_config.node_id, mate_token(args.data_dir))
    lease = mate_lease(*named, args.mate_lease_secs, secret=mesh_config.secret)
    # Its alive key on a client of its own: a slow etcd call there never fails the lease's calls.
    present = mate_lease(*named, args.mate_lease_secs, secret=mesh_config.secret)
    presence = asyncio.create_task(present.stay_present(), name="meshplane-mate-presence")
    try:
        while not stop.is_set():
            standby = Standby(
                DirectoryReplica(args.data_dir),
                lease,
                node_id=mesh_config.node_id,
                cluster=mesh_config.cluster,
                secret=mesh_config.secret,
                tls=mesh_config.tls.client_context() if mesh_config.tls is not None else None,
                max_payload=mesh_config.max_payload,
            )
            _say(
                f"HA mate {lease.token}: standby (etcd {args.mates_etcd}); taking over when the lease is free"
            )
            if not await standby.run(stop):
                break
            await asyncio.to_thread(os.sync)  # what was mirrored into the page cache, on disk first
            mirrored = f"{standby.barriers} barriers, {standby.replica.bytes} bytes mirrored"
            _say(f"HA mate {lease.token}: active (epoch {lease.epoch}, {mirrored})")
            active = asyncio.Event()
            watch = asyncio.create_task(_set_when_either(stop, lease.lost, active))
            try:
                await _serve_locked(args, tokens, tls, mesh_config, active, lease)
            finally:
                watch.cancel()
                await lease.step_down()
    finally:
        presence.cancel()
        await present.close()
        await lease.close()
    return 0


def _say(line: str) -> None:
    print(f"meshplane serve: {line}", file=sys.stderr, flush=True)


async def _set_when_either(first: asyncio.Event, second: asyncio.Event, then: asyncio.Event) -> None:
    waits = [asyncio.create_task(first.wait()), asyncio.create_task(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    then.set()


async def _serve_locked(
    args: argparse.Namespace,
    tokens: Tokens | None,
    tls: ssl.SSLContext | None,
    mesh_config: MeshConfig | None,
    stop: asyncio.Event,
    lease: MateLease | None = None,
) -> int:
    from meshplane.config import PlaneConfig
    from meshplane.dashboard.meshview import register_node
    from meshplane.discovery import create_discovery
    from meshplane.discovery.base import Discovery
    from meshplane.mesh.node import MeshNode
    from meshplane.streams.http.app import serve

    engine = streams_engine(args, mesh_config)
    mesh = MeshNode(mesh_config) if mesh_config is not None else None
    if mesh is not None and mesh_config is not None and mesh_config.vpns_file is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, mesh.logins.reloads.reload)
    published: list[asyncio.Task[None]] = []
    if lease is not None and mesh is not None:
        from meshplane.mesh.mates import MirrorServer
        from meshplane.streams.mirror import DirectorySource

        source = DirectorySource(args.data_dir)
        sync_every = {"always": 0.0, "interval": args.fsync_interval_ms / 1000}.get(args.fsync)
        mesh.mirror = MirrorServer(mesh.node_id, source, lease, args.mate_ack_timeout, sync_every)
        engine.durability.replicate = mesh.mirror.barrier

    def ready(port: int) -> None:
        announced: dict[str, Any] = {
            "url": f"{'https' if tls else 'http'}://{args.host}:{port}",
            "data_dir": str(args.data_dir),
            "auth": tokens is not None,
        }
        if mesh is not None:
            announced["mesh"] = {
                "node": mesh.node_id,
                "cluster": mesh.config.cluster,
                "route_url": mesh.route_url,
            }
            # The ports the doors got (given 0: any free one), as route_url has the route port's.
            if mesh.mqtt is not None and mesh.mqtt.config_port is not None:
                announced["mesh"]["mqtt_port"] = mesh.mqtt.port
            if mesh.mqtt is not None and mesh.mqtt.ws is not None:
                announced["mesh"]["mqtt_ws_port"] = mesh.mqtt.ws.port
            if mesh.nats is not None:
                announced["mesh"]["nats_port"] = mesh.nats.port
        print(json.dumps(announced), flush=True)
        settle_heap()
        if lease is not None and mesh is not None:
            published.append(asyncio.create_task(lease.publish(mesh.route_url)))
        if discovery is not None and mesh is not None:  # for the dashboards' mesh view
            record = register_node(discovery, mesh.node_id, mesh.config.cluster, announced["url"])
            published.append(asyncio.create_task(record))

    # The dashboard's event plane page lists what the plane's discovery (from the environment) holds.
    try:
        discovery: Discovery | None = create_discovery(PlaneConfig.from_env())
    except ConfigError as exc:
        print(f"the dashboard shows no event plane: {exc}", file=sys.stderr, flush=True)
        discovery = None
    try:
        await serve(
            engine,
            args.host,
            args.port,
            tokens=tokens,
            tls=tls,
            on_ready=ready,
            stop=stop,
            mesh=mesh,
            discovery=discovery,
            vpns=mesh_config.vpns if mesh_config is not None else server_vpns(args.mesh_vpns),
        )
    finally:
        if mesh is not None and mesh.mirror is not None:
            mesh.mirror.close()
        for task in published:
            task.cancel()
        if discovery is not None:
            await discovery.close()
    return 0
