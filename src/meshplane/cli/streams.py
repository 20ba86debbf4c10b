"""``meshplane serve`` and the streams client commands: ``stream``, ``topic`` and ``group``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplane import context
from meshplane.cli.consume import add_consume_options, consume_group, consume_topic, say
from meshplane.cli.errors import CliError
from meshplane.cli.options import HelpFormatter, add_token_option
from meshplane.cli.produce import add_produce_options, json_or_text, produce
from meshplane.cli.tables import RENDERERS
from meshplane.config import default_state_dir
from meshplane.errors import ConfigError, NotFound
from meshplane.streams.access import Tokens
from meshplane.streams.errors import UNAUTHORIZED, StreamError, Unauthorized
from meshplane.streams.lock import DataDirLock

if TYPE_CHECKING:
    from meshplane.mesh.config import MeshConfig
from meshplane.streams.service import StreamsConfig, StreamsService

DEFAULT_URL = "http://127.0.0.1:15500"
TOKEN_ENV = "MESHPLANE_STREAMS_TOKEN"
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
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require tokens: one a line, each with its scopes (read, write, admin, optionally :PREFIX; "
        f"none: admin). ${TOKEN_ENV} adds one admin token. Neither: no auth",
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
        ("--room-memory-bytes", int, "memory for all rooms' histories together"),
        ("--max-open-files", int, "segment files open at once (default: half of RLIMIT_NOFILE)"),
        ("--idempotency-ttl-secs", float, "how long an idempotent publish is remembered"),
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
    servers = [url.strip() for url in args.storage.split(",") if url.strip()]
    if not servers or not all(url.startswith(("nats://", "tls://")) for url in servers):
        raise ConfigError(f"--storage is local or nats://HOST:PORT[,...], not {args.storage!r}")
    if mesh_config is not None:
        raise ConfigError("a mesh node (--node-id) keeps its guaranteed queues locally: use --storage local")
    from meshplane.streams.jetstream.service import JetStreamStreamsService

    def progress(line: str) -> None:
        print(f"meshplane serve: {line}", file=sys.stderr, flush=True)

    return JetStreamStreamsService(
        config, servers, replicas=args.replicas, start_timeout=args.storage_timeout, progress=progress
    )


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
    "--room-memory-bytes": "room_memory_bytes",
    "--max-open-files": "max_open_files",
    "--idempotency-ttl-secs": "idempotency_ttl_secs",
    "--idle-timeout": "idle_timeout_secs",
    "--body-timeout": "body_timeout_secs",
    "--push-keepalive": "push_keepalive_secs",
}


async def run_serve(args: argparse.Namespace) -> int:
    require_streams_extra()
    from meshplane.cli.mesh import mesh_config_from_args
    from meshplane.streams.http.app import server_tls

    tokens = Tokens.load(args.token_file, os.environ.get(TOKEN_ENV))
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    try:
        tls = server_tls(args.tls_cert, args.tls_key) if args.tls_cert else None
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate or key: {exc}") from None
    mesh_config = mesh_config_from_args(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lock = DataDirLock(args.data_dir)
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


async def _serve_locked(
    args: argparse.Namespace,
    tokens: Tokens | None,
    tls: ssl.SSLContext | None,
    mesh_config: MeshConfig | None,
    stop: asyncio.Event,
) -> int:
    from meshplane.config import PlaneConfig
    from meshplane.discovery import create_discovery
    from meshplane.discovery.base import Discovery
    from meshplane.mesh.node import MeshNode
    from meshplane.streams.http.app import serve

    engine = streams_engine(args, mesh_config)
    mesh = MeshNode(mesh_config) if mesh_config is not None else None

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
        print(json.dumps(announced), flush=True)

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
        )
    finally:
        if discovery is not None:
            await discovery.close()
    return 0


def add_client_commands(commands: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        type=streams_url,
        default=None,
        help=f"server URL (default: $MESHPLANE_STREAMS_URL, the selected context's, or {DEFAULT_URL})",
    )
    add_token_option(common, TOKEN_ENV, "the server's bearer token")
    common.add_argument(
        "--json", action="store_true", help="JSON even at a terminal (tables and indentation are for people)"
    )

    def client_parser(name: str, help_text: str) -> Callable[..., argparse.ArgumentParser]:
        """A command whose actions all take --url and --token-file (after the action, as users type them)."""
        parser = commands.add_parser(name, help=help_text, description=help_text)
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        def add_action(
            action_name: str, help: str, example: str = "", **kwargs: Any
        ) -> argparse.ArgumentParser:
            description = kwargs.pop("description", help) + (f". Example: {example}" if example else "")
            created: argparse.ArgumentParser = actions.add_parser(
                action_name,
                parents=[common],
                help=help,
                description=description,
                formatter_class=HelpFormatter,
                **kwargs,
            )
            return created

        return add_action

    action = client_parser("stream", "rooms: publish, tail, history, stats, list")
    p = action(
        "publish",
        "publish DATA (JSON, else a string) as EVENT",
        'meshplane stream publish chat msg \'{"text": "hi"}\'',
    )
    p.add_argument("room", help="room name (made on first publish)")
    p.add_argument("event", help="event type, e.g. message")
    p.add_argument("data", help="the event's data: JSON, or any other text as a string")
    p = action(
        "tail",
        "print events as they are published (JSON lines)",
        "meshplane stream tail chat --from-offset -10",
    )
    p.add_argument("room", help="room name")
    p.add_argument(
        "--from-offset", type=int, default=None, help="start here (negative: the last N; none: new events)"
    )
    p.add_argument(
        "--subscriber-id", default="meshplane-cli", help="the name the server knows this subscriber by"
    )
    p.add_argument("--count", type=int, default=0, help="stop after N events (0: never)")
    p = action("history", "print stored events of a room", "meshplane stream history chat --limit 20")
    p.add_argument("room", help="room name")
    p.add_argument(
        "--from-offset", type=int, default=None, help="first offset (negative: the last N; none: the oldest)"
    )
    p.add_argument("--to-offset", type=int, default=None, help="last offset (none: the newest)")
    p.add_argument("--limit", type=int, default=100, help="at most this many events")
    p = action("stats", "a room's offsets, sizes and subscribers")
    p.add_argument("room", help="room name")
    action("list", "the rooms")

    action = client_parser("topic", "partitioned topics: create, publish, produce, consume, stats, list")
    p = action("create", "create a partitioned topic", "meshplane topic create orders --partitions 4")
    p.add_argument("topic", help="topic name")
    p.add_argument("--partitions", type=int, default=3, help="number of partitions")
    p.add_argument(
        "--retention",
        default=None,
        help='JSON, e.g. \'{"type": "Messages", "max_messages": 1000}\' (none: keep all)',
    )
    p.add_argument("--segment-bytes", type=int, default=None, help="segment file size (none: the server's)")
    p = action(
        "publish",
        "publish one event, routed by key",
        "meshplane topic publish orders created '{\"id\": 1}' --key c-7",
    )
    p.add_argument("topic", help="topic name")
    p.add_argument("event_type", help="event type, e.g. order.created")
    p.add_argument("data", help="the event's data: JSON, or any other text as a string")
    p.add_argument(
        "--key", default=None, help="routing key: the same key, the same partition (none: round robin)"
    )
    p = action(
        "consume",
        "print events of every partition as JSON lines, following new ones (like kcat -C)",
        "meshplane topic consume orders -e; meshplane topic consume orders -o -10 -p 0",
        description="Read TOPIC from -o (beginning by default) and follow new events until Ctrl-C; "
        "-e exits at the end",
    )
    p.add_argument("topic", help="topic name")
    add_consume_options(p, group=False)
    p = action(
        "produce",
        "publish standard input, one event per line; -K splits a key off (like kcat -P -K)",
        "printf 'customer-7:{\"id\": 1}\\n' | meshplane topic produce orders -K :",
    )
    add_produce_options(p)
    p = action("stats", "a topic's partitions: offsets, sizes, retention")
    p.add_argument("topic", help="topic name")
    action("list", "the topics")

    action = client_parser(
        "group", "consumer groups: create, consume, join, assignment, heartbeat, commit, offset, leave, stats"
    )
    p = action("create", "create a consumer group on a topic", "meshplane group create processors orders")
    p.add_argument("group", help="group name")
    p.add_argument("topic", help="the topic whose partitions the group shares out")
    p.add_argument(
        "--strategy", choices=["round_robin", "range", "sticky"], default="round_robin", help="assignor"
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=None,
        help="seconds without a heartbeat before a member is evicted (none: the server's)",
    )
    p.add_argument(
        "--partitions", type=int, default=None, help="partitions of a topic that does not exist yet"
    )
    p = action(
        "consume",
        "consume as a member of GROUP: assigned partitions, committed offsets, rebalances (kcat -G)",
        "meshplane group consume processors",
        description="Join GROUP, print the events of the partitions it assigns this member from the "
        "group's committed offsets, commit each batch before printing it, heartbeat, follow rebalances, "
        "and leave on exit. Run it twice to share the partitions",
    )
    p.add_argument("group", help="group name")
    p.add_argument(
        "--topic",
        default=None,
        help="create the group on TOPIC if it does not exist (as kcat -G does; default: it must exist)",
    )
    add_consume_options(p, group=True)
    p = action("join", "join a group by hand (group consume does all of it)")
    p.add_argument("group", help="group name")
    p.add_argument("--member-id", default=None, help="this member's id (none: the server picks one)")
    for name, what in (
        ("assignment", "a member's partitions"),
        ("heartbeat", "keep a member's session"),
        ("leave", "leave a group (its partitions go to the others)"),
    ):
        p = action(name, what)
        p.add_argument("group", help="group name")
        p.add_argument("member_id", help="the member id join returned")
    p = action("commit", "commit an offset (fenced by --generation when --member-id is given)")
    p.add_argument("group", help="group name")
    p.add_argument("partition", type=int, help="partition number")
    p.add_argument("offset", type=int, help="the next offset to read")
    p.add_argument("--member-id", default=None, help="commit as this member (fenced)")
    p.add_argument("--generation", type=int, default=None, help="the generation the member was given")
    p = action("offset", "a partition's committed offset")
    p.add_argument("group", help="group name")
    p.add_argument("partition", type=int, help="partition number")
    p = action("stats", "a group's members, generation, assignment and lag")
    p.add_argument("group", help="group name")

    action = client_parser("mesh", "the event mesh: a node's links, interest and counters")
    action("status", "the node at --url: its links (state, interest, events, drops), interest and counters")
    action("queues", "the node's queues (guaranteed subscriptions) and its spools")
    p = action(
        "queue-add",
        "make a queue: guaranteed events matching PATTERNs, stored in the topic NAME on this node",
        example="meshplane mesh queue-add orders 'orders.>'",
    )
    p.add_argument("name", help="queue (and topic) name")
    p.add_argument("patterns", nargs="+", metavar="PATTERN", help="subjects, with * > # wildcards")
    p = action("queue-delete", "stop a queue's interest (its topic and events stay)")
    p.add_argument("name", help="queue name")
    p = action(
        "forget",
        "forget a departed node: its interest, the events spooled for it and its remembered queues "
        "(a linked node is refused: stop it first)",
        example="meshplane mesh forget ghost --url http://127.0.0.1:15501",
    )
    p.add_argument("node", help="the node id")


def streams_url(text: str) -> str:
    """``host:port`` is taken as ``http://host:port``; other schemes than http(s) are refused."""
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a streams server URL (like http://127.0.0.1:15500)"
        )
    return url.rstrip("/")


def _data(text: str) -> Any:
    return json_or_text(text, "DATA", "quote it as a JSON string to send text")


def _json_option(name: str, text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError as exc:
        raise CliError(f"{name} is not valid JSON: {exc}") from None


def _print(value: Any, *, line: bool = False, args: argparse.Namespace | None = None) -> None:
    """At a terminal: a table where the answer has one, else indented JSON; in a pipe or with --json,
    one JSON line (streamed events always)."""
    at_terminal = sys.stdout.isatty() and not line and not (args is not None and args.json)
    render = RENDERERS.get((args.command, args.action)) if args is not None and at_terminal else None
    if render is not None:
        print(render(value), flush=True)
        return
    print(json.dumps(value, default=str, indent=2 if at_terminal else None), flush=True)


def require_streams_extra() -> None:
    """The streams server and client run on aiohttp and prometheus-client: the ``streams`` extra."""
    try:
        import aiohttp  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigError("the streams commands need: pip install 'meshplane[streams]'") from None


async def run_client(args: argparse.Namespace) -> int:
    require_streams_extra()
    import aiohttp

    try:
        return await _run_client(args)
    except aiohttp.ClientResponseError as exc:  # e.g. the WebSocket of `stream tail` refused
        if exc.status == 401:
            raise Unauthorized(UNAUTHORIZED) from None
        raise StreamError(f"the streams server at {args.url} answered {exc.status} {exc.message}") from None
    except aiohttp.ClientError as exc:
        raise StreamError(f"cannot reach the streams server at {args.url}: {exc}") from None


async def _run_client(args: argparse.Namespace) -> int:
    from meshplane.streams.client import StreamsClient

    env = context.environment()
    fallback = env.get("MESHPLANE_MESH_URL") if args.command == "mesh" else None  # up --nodes: node a
    args.url = args.url or streams_url(fallback or env.get("MESHPLANE_STREAMS_URL") or DEFAULT_URL)
    args.token = args.token or env.get(TOKEN_ENV)
    async with StreamsClient(args.url, token=args.token) as client:
        command, action = args.command, args.action
        if command == "mesh":
            if action == "queue-add":
                path = f"/mesh/queues/{urllib.parse.quote(args.name, safe='')}"
                _print(await client.request("PUT", path, {"patterns": args.patterns}))
            elif action == "queue-delete":
                _print(
                    await client.request("DELETE", f"/mesh/queues/{urllib.parse.quote(args.name, safe='')}")
                )
            elif action == "forget":
                path = f"/mesh/nodes/{urllib.parse.quote(args.node, safe='')}"
                _print(await client.request("DELETE", path))
            elif action == "queues":
                answer = await client.request("GET", "/mesh")
                _print(answer.get("guaranteed", {}), args=args)
            else:
                _print(await client.request("GET", "/mesh"), args=args)
        elif command == "stream":
            if action == "publish":
                _print({"offset": await client.publish(args.room, args.event, _data(args.data))})
            elif action == "tail":
                try:
                    await client.room_stats(args.room)
                except NotFound:  # publishing makes it: wait for that, but say so
                    say(f"room {args.room!r} does not exist yet: waiting for its first event (Ctrl-C stops)")
                seen = 0
                async for event in client.subscribe(args.room, args.subscriber_id, args.from_offset):
                    _print(event, line=True)
                    seen += 1
                    if args.count and seen >= args.count:
                        break
            elif action == "history":
                _print(
                    await client.history(args.room, args.from_offset, args.to_offset, args.limit), args=args
                )
            elif action == "stats":
                _print(await client.room_stats(args.room), args=args)
            else:
                _print(await client.rooms(), args=args)
        elif command == "topic":
            if action == "create":
                retention = _json_option("--retention", args.retention)
                _print(
                    await client.create_topic(
                        args.topic,
                        args.partitions,
                        retention_policy=retention,
                        segment_bytes=args.segment_bytes,
                    )
                )
            elif action == "publish":
                p, offset = await client.publish_to_topic(
                    args.topic, args.event_type, _data(args.data), key=args.key
                )
                _print({"partition_id": p, "offset": offset})
            elif action == "consume":
                return await consume_topic(client, args)
            elif action == "produce":
                return await produce(client, args)
            elif action == "stats":
                _print(await client.topic_stats(args.topic), args=args)
            else:
                _print(await client.topics(), args=args)
        else:
            if action == "create":
                _print(
                    await client.create_group(
                        args.group,
                        args.topic,
                        partition_count=args.partitions,
                        strategy=args.strategy,
                        session_timeout_secs=args.session_timeout,
                    )
                )
            elif action == "consume":
                return await consume_group(client, args)
            elif action == "join":
                _print(await client.join(args.group, member_id=args.member_id), args=args)
            elif action in ("assignment", "heartbeat", "leave"):
                _print(await getattr(client, action)(args.group, args.member_id), args=args)
            elif action == "commit":
                _print(
                    await client.commit(
                        args.group,
                        args.partition,
                        args.offset,
                        member_id=args.member_id,
                        generation=args.generation,
                    )
                )
            elif action == "offset":
                _print({"offset": await client.committed(args.group, args.partition)})
            else:
                _print(await client.group_stats(args.group), args=args)
    return 0
