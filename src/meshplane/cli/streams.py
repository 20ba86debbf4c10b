"""The streams client commands: ``stream``, ``topic``, ``group`` and ``mesh`` (``serve`` is in serve.py)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

from meshplane import context
from meshplane.cli.consume import add_consume_options, consume_group, consume_topic, say
from meshplane.cli.errors import CliError
from meshplane.cli.mates import add_mates_options, run_mates
from meshplane.cli.options import HelpFormatter, add_token_option
from meshplane.cli.produce import add_produce_options, json_or_text, produce
from meshplane.cli.tables import RENDERERS
from meshplane.core.mesh.vpn import check_vpn
from meshplane.errors import ConfigError, NotFound
from meshplane.streams.errors import UNAUTHORIZED, StreamError, Unauthorized

DEFAULT_URL = "http://127.0.0.1:15500"
TOKEN_ENV = "MESHPLANE_STREAMS_TOKEN"
VPN_ENV = "MESHPLANE_STREAMS_VPN"


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
        "--vpn",
        metavar="NAME",
        type=vpn_name,
        help="the Message VPN to work in, for the server's operator (sent as X-Meshplane-Vpn; a VPN's own "
        f"token needs none). Default: ${VPN_ENV} or the selected context's",
    )
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

    action = client_parser(
        "topic", "partitioned topics: create, publish, produce, consume, stats, readers, list"
    )
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
    p = action("readers", "who reads a topic outside groups (Spark queries): offsets, lag")
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

    from meshplane.cli.vpn import add_vpn_actions

    add_vpn_actions(client_parser("vpn", "a mesh node's Message VPNs: list, show, check a file, reload"))
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
    p = action(
        "mates",
        "etcd's view of a node's HA mates (active, epoch, current, each mate's token); `mates reset` "
        "deletes current when every mate it names is gone for good (refused while one runs)",
        example="meshplane mesh mates --etcd http://127.0.0.1:2379 --node a",
    )
    add_mates_options(p)
    action(
        "hash-password",
        "print an argon2 hash of a Message VPN user's password (read from stdin, never argv) for the "
        "--mesh-vpns file's password_hash",
        example="meshplane mesh hash-password < password.txt",
    )


def hash_password_from_stdin() -> int:
    import getpass
    import sys

    from meshplane.mesh.vpns import hash_password

    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        raise CliError("no password on stdin")
    print(hash_password(password))
    return 0


def streams_url(text: str) -> str:
    """``host:port`` is taken as ``http://host:port``; other schemes than http(s) are refused."""
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a streams server URL (like http://127.0.0.1:15500)"
        )
    return url.rstrip("/")


def vpn_name(text: str) -> str:
    try:
        return check_vpn(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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
    except aiohttp.ClientConnectorCertificateError as exc:
        raise StreamError(await refused_certificate(args.url, exc)) from None
    except aiohttp.ClientResponseError as exc:  # e.g. the WebSocket of `stream tail` refused
        if exc.status == 401:
            raise Unauthorized(UNAUTHORIZED) from None
        raise StreamError(f"the streams server at {args.url} answered {exc.status} {exc.message}") from None
    except aiohttp.ClientError as exc:
        raise StreamError(f"cannot reach the streams server at {args.url}: {exc}") from None


async def refused_certificate(url: str, exc: Any) -> str:
    """An https server whose certificate was refused: the name expected, the names it has."""
    from meshplane.certs import refusal

    reason = getattr(exc.certificate_error, "verify_message", None) or exc.certificate_error
    return await refusal(f"the streams server at {url}", exc.host, exc.port, reason, "SSL_CERT_FILE")


async def _run_client(args: argparse.Namespace) -> int:
    from meshplane.streams.client import StreamsClient

    if args.command == "mesh" and args.action == "mates":  # etcd's, whichever mate runs (or none)
        return await run_mates(args)
    if args.command == "mesh" and args.action == "hash-password":
        return hash_password_from_stdin()
    if args.command == "vpn" and args.action == "check":
        from meshplane.cli.vpn import check_file

        return check_file(args.file)

    env = context.environment()
    of_mesh = args.command in ("mesh", "vpn")
    fallback = env.get("MESHPLANE_MESH_URL") if of_mesh else None  # up --nodes: node a
    args.url = args.url or streams_url(fallback or env.get("MESHPLANE_STREAMS_URL") or DEFAULT_URL)
    args.token = args.token or env.get(TOKEN_ENV)
    async with StreamsClient(args.url, token=args.token, vpn=args.vpn or env.get(VPN_ENV) or None) as client:
        command, action = args.command, args.action
        if command == "vpn":
            from meshplane.cli.vpn import run_vpn

            _print(await run_vpn(args, client.request), args=args)
        elif command == "mesh":
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
            elif action == "readers":
                _print(await client.topic_readers(args.topic), args=args)
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
