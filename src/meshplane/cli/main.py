"""``meshplane``: run a local event plane, publish, subscribe and list event channels."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import argcomplete
import msgspec
from argcomplete.shell_integration import shellcode

from meshplane import runloop
from meshplane.aio import cancel_and_wait
from meshplane.cli.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NOTHING, report
from meshplane.cli.examples import EXAMPLES
from meshplane.cli.matching import PublisherMatch, match_publishers
from meshplane.cli.options import (
    HelpFormatter,
    add_plane_options,
    config_from_args,
    parse_with_suggestions,
    require_discovery_folder,
    scope_arg,
    subcommands,
)
from meshplane.cli.tables import plural
from meshplane.core.envelope import EventEnvelope
from meshplane.core.names import EVENT_CHANNELS_BUCKET, Scope
from meshplane.discovery.channels import parse_channel
from meshplane.errors import DiscoveryError, MeshplaneError

if TYPE_CHECKING:
    from meshplane.plane import EventPlane
    from meshplane.subscriber import EventSubscriber

SCOPE_HELP = "scope as ns, ns/component or ns/component/endpoint (e.g. dynamo/worker/generate)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshplane",
        description="meshplane: a Python event plane over NATS and ZeroMQ, wire-compatible with Dynamo.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"meshplane {version('meshplane')}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    up = commands.add_parser(
        "up",
        help="run a local event plane with demo traffic",
        description="Start a local event plane (an embedded nats-server on a free loopback port and file "
        "discovery in a state folder), run demo publishers and a subscriber, and show live what "
        "flows until Ctrl-C.",
    )
    from meshplane.cli.up import add_up_options

    add_up_options(up)

    pub = commands.add_parser(
        "pub",
        help="publish events",
        description="Publish MESSAGE (or each line of standard input) on TOPIC in SCOPE.",
    )
    pub.add_argument("scope", type=scope_arg, metavar="SCOPE", help=SCOPE_HELP)
    pub.add_argument("topic", metavar="TOPIC", help="topic name, e.g. kv-events")
    pub.add_argument(
        "message", nargs="*", metavar="MESSAGE", help="messages to publish; none: read lines from stdin"
    )
    pub.add_argument(
        "--json",
        action="store_true",
        help="parse each message as JSON and publish it MessagePack-encoded (default: raw bytes)",
    )
    pub.add_argument(
        "--count", type=int, default=1, metavar="N", help="publish each message N times (default 1)"
    )
    pub.add_argument(
        "--rate", type=float, default=0.0, metavar="R", help="at most R events per second (default: no limit)"
    )
    pub.add_argument(
        "--wait-subscribers",
        type=int,
        default=0,
        metavar="N",
        help="ZeroMQ: first wait until N subscribers are connected, so none misses the first events",
    )
    pub.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="how long --wait-subscribers waits (default 10)",
    )
    add_plane_options(pub)

    sub = commands.add_parser(
        "sub",
        help="tail events",
        description="Print every event of TOPIC in SCOPE from every publisher, as it arrives.",
    )
    sub.add_argument("scope", type=scope_arg, metavar="SCOPE", help=SCOPE_HELP)
    sub.add_argument("topic", metavar="TOPIC", help="topic name, e.g. kv-events")
    sub.add_argument(
        "--json", action="store_true", help="one JSON object per line instead of the human format"
    )
    sub.add_argument(
        "--count", type=int, default=0, metavar="N", help="exit after N events (default: run until Ctrl-C)"
    )
    sub.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="exit with status 1 if no event arrives for S seconds (default: wait forever)",
    )
    add_plane_options(sub)

    from meshplane.cli.broker import add_broker_options, add_stats_options

    broker = commands.add_parser(
        "broker",
        help="run a ZeroMQ broker (XSUB/XPUB relay) for broker mode",
        description="Relay events from publishers (XSUB side) to subscribers (XPUB side), forwarding "
        "subscriptions upstream. Counts messages in and out, drops, subscriptions and peers. Prints its "
        "addresses as one JSON line, registers in discovery, and stops cleanly on SIGTERM or Ctrl-C.",
    )
    add_broker_options(broker)
    broker_stats = commands.add_parser(
        "broker-stats",
        help="print a running broker's counters",
        description="Print a broker's counters as JSON.",
    )
    add_stats_options(broker_stats)

    from meshplane.cli.serve import add_serve_options
    from meshplane.cli.streams import add_client_commands

    serve = commands.add_parser(
        "serve",
        help="run the streams server (rooms, partitioned topics, consumer groups; Synap-compatible HTTP)",
        description="Serve durable event streams over HTTP, WebSocket and server-sent events. Prints its URL "
        "as one JSON line; stops cleanly on SIGTERM or Ctrl-C.",
    )
    add_serve_options(serve)
    from meshplane.cli.mesh import add_mesh_options

    add_mesh_options(serve)
    serve.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="read settings from this TOML file (`meshplane config show` prints one); the environment "
        "and flags win over it",
    )
    from meshplane.cli.config_file import add_config_commands

    add_config_commands(commands)
    add_client_commands(commands)

    from meshplane.cli.log import add_log_commands

    add_log_commands(commands)

    from meshplane.cli.contexts import add_context_commands

    add_context_commands(commands)

    from meshplane.cli.tls import add_tls_commands

    add_tls_commands(commands)

    from meshplane.cli.shell import add_shell_options

    add_shell_options(
        commands.add_parser(
            "shell",
            help="your shell with this meshplane first on PATH, after your rc files (what `make shell` runs)",
            description="Start your shell ($SHELL) with this installation's bin folder first on PATH once "
            "its start-up files have run (a ~/.bashrc that puts pyenv's or conda's shims first cannot hide "
            "it); exit returns to where you were.",
        )
    )

    completion = commands.add_parser(
        "completion",
        help="print the shell code that completes meshplane's commands (bash, zsh, fish)",
        description='Print shell completion code: `eval "$(meshplane completion bash)"` (or add that line '
        "to ~/.bashrc); zsh and fish likewise.",
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"], help="your shell")

    from meshplane.cli.status import add_status_options

    status = commands.add_parser(
        "status",
        help="check that discovery, NATS, the mesh node, brokers and the streams server are up and take "
        "this shell's credentials (exit 0 when all do)",
        description="One line per check: the selected context, discovery, NATS (when the plane uses it), "
        "the mesh node (a mesh plane: its secret and certificates), the brokers of broker mode, and the "
        "streams server (when a URL is known: a route that needs its token). Exits 0 when all are up, 3 "
        "when something is down, 4 when credentials were missing or refused.",
    )
    add_status_options(status)

    from meshplane.cli.bench import add_bench_options

    bench = commands.add_parser(
        "bench",
        help="run the benchmarks of a source checkout against their raw peers, with progress bars",
        description="Run bench/*.py of a meshplane checkout one after another, each against its raw peer "
        "(pyzmq, nats-py, Redis, nats-server, ...) in the same run; results go to bench/results/. Needs "
        "the bench extra; the streams benchmark also needs redis-server (make bench installs it).",
    )
    add_bench_options(bench)

    from meshplane.cli.pipeline import add_pipeline_options

    pipeline = commands.add_parser(
        "pipeline",
        help="Spark pipelines over meshplane streams (needs the spark extra)",
        description="Run the example Spark Structured Streaming pipeline.",
    )
    add_pipeline_options(pipeline)

    ls = commands.add_parser(
        "ls",
        help="list discovered event channels",
        description="List the publishers registered in discovery (optionally only those under SCOPE).",
    )
    ls.add_argument("scope", type=scope_arg, nargs="?", metavar="SCOPE", help=SCOPE_HELP + "; default: all")
    ls.add_argument("--json", action="store_true", help="print the raw records as JSON lines")
    add_plane_options(ls)
    for name, command in commands.choices.items():
        if name in EXAMPLES:  # a command's help ends with how it is used
            command.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
            if command.formatter_class is argparse.HelpFormatter:
                command.formatter_class = HelpFormatter
    return parser


def _payload_view(payload: bytes) -> Any:
    """The payload decoded as MessagePack when it is, else text when it is, else base64."""
    try:
        return msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        pass
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(payload).decode()}


def format_event(envelope: EventEnvelope, as_json: bool) -> str:
    view = _payload_view(envelope.payload)
    if as_json:
        return json.dumps(
            {
                "topic": envelope.topic,
                "publisher_id": f"{envelope.publisher_id:x}",  # hex, as everywhere the CLI shows it
                "sequence": envelope.sequence,
                "published_at": envelope.published_at,
                "payload": view,
            },
            default=repr,
        )
    stamp = time.strftime("%H:%M:%S", time.localtime(envelope.published_at / 1000))
    return (
        f"{stamp}.{envelope.published_at % 1000:03d} {envelope.topic} "
        f"pub={envelope.publisher_id:x} seq={envelope.sequence} {view!r}"
    )


async def run_pub(args: argparse.Namespace) -> int:
    from meshplane import EventPublisher

    messages = args.message or (line.rstrip("\n") for line in sys.stdin)
    async with await EventPublisher.create(args.scope, args.topic, config=config_from_args(args)) as pub:
        if args.wait_subscribers:
            await pub.wait_for_subscribers(args.wait_subscribers, args.timeout)
        interval = 1.0 / args.rate if args.rate > 0 else 0.0
        sent = 0
        for text in messages:
            event = json.loads(text) if args.json else text.encode()
            for _ in range(args.count):
                await pub.publish(event)
                sent += 1
                if interval:
                    await asyncio.sleep(interval)
        await pub.flush()
        print(f"published {plural(sent, 'event')} as {pub.publisher_id:x}", file=sys.stderr)
    return 0


async def _match(plane: EventPlane, scope: Scope, topic: str) -> PublisherMatch | None:
    """Who publishes ``topic`` in or below ``scope``; None where discovery cannot tell (broker mode,
    or discovery unreachable: the transport may still deliver by subject)."""
    if plane.config.broker_mode:
        return None
    try:
        records = await (await plane.discovery()).list(f"{EVENT_CHANNELS_BUCKET}/")
    except DiscoveryError:
        return None
    channels = []
    for key, value in records.items():
        with contextlib.suppress(MeshplaneError):  # `ls` reports invalid records; here they are noise
            channels.append(parse_channel(key, value))
    return match_publishers(scope, topic, channels)


async def run_sub(args: argparse.Namespace) -> int:
    from meshplane.plane import EventPlane

    async with EventPlane(config_from_args(args)) as plane:
        match = await _match(plane, args.scope, args.topic)
        if match is not None:
            print(match.describe(), file=sys.stderr, flush=True)
        scopes = list(match.reached) if match is not None and match.reached else [args.scope]
        arrived: asyncio.Queue[EventEnvelope] = asyncio.Queue(maxsize=10_000)

        async def forward(subscriber: EventSubscriber) -> None:
            async for envelope in subscriber:
                await arrived.put(envelope)

        subscribers = [await plane.subscriber(scope, args.topic) for scope in scopes]
        for subscriber in subscribers:
            # timeouts, recoveries and gaps go to stderr, so that stdout stays one event per line
            subscriber.on_notice(lambda notice: print(f"notice: {notice}", file=sys.stderr, flush=True))
        pumps = [asyncio.create_task(forward(s)) for s in subscribers]
        try:
            seen = 0
            while not args.count or seen < args.count:
                try:
                    async with asyncio.timeout(args.timeout or None):
                        envelope = await arrived.get()
                except TimeoutError:
                    why = await _match(plane, args.scope, args.topic)
                    reason = f" ({why.describe()})" if why is not None else ""
                    print(f"no event for {args.timeout:g}s{reason}", file=sys.stderr)
                    return EXIT_NOTHING
                print(format_event(envelope, args.json), flush=True)
                seen += 1
        finally:
            for pump in pumps:
                await cancel_and_wait(pump)
    return 0


async def run_ls(args: argparse.Namespace) -> int:
    from meshplane.discovery import create_discovery

    config = config_from_args(args)
    require_discovery_folder(config)
    discovery = create_discovery(config)
    await discovery.start()
    try:
        records = await discovery.list(
            args.scope.key_prefix + "/" if args.scope else EVENT_CHANNELS_BUCKET + "/"
        )
    finally:
        await discovery.close()
    bad = 0
    if not args.json:
        print(f"{'SCOPE':<32} {'TOPIC':<24} {'PUBLISHER':<16} {'TRANSPORT':<9} ADDRESS")
    for key, value in sorted(records.items()):
        try:
            channel = parse_channel(key, value)
        except MeshplaneError as exc:
            bad += 1
            print(f"invalid record {key}: {exc}", file=sys.stderr)
            continue
        if args.json:
            print(value.decode())
            continue
        address = channel.transport_config.get("endpoint") or channel.transport_config.get(
            "subject_prefix", ""
        )
        print(
            f"{channel.scope!s:<32} {channel.topic:<24} {channel.instance_id:<16x} "
            f"{channel.transport_kind:<9} {address}"
        )
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argcomplete.autocomplete(parser)  # answers a shell's completion request (and exits); else nothing
    args = parse_with_suggestions(parser, argv)
    if args.command is None:  # a bare `meshplane`: what it can do, rather than an error
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command in ("config", "serve"):
            from meshplane.cli.config_file import load_for_serve, refuse_broken, run_config

            serve = subcommands(parser)["serve"]
            if args.command == "config":
                return run_config(args, serve)
            config = load_for_serve(serve, args.config) if args.config is not None else None
            if config is not None:  # its values become serve's defaults: flags still win
                args = parse_with_suggestions(parser, argv)
            words = sys.argv[1:] if argv is None else argv
            refuse_broken(serve, args, config, words[words.index("serve") + 1 :])  # file and flags together
        return _run(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `meshplane sub ... | head`: the reader has gone, so are we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # one line for what the user can act on; a bug keeps its traceback
        return report(exc)


def _run(args: argparse.Namespace) -> int:
    if args.command == "completion":
        print(shellcode(["meshplane"], shell=args.shell))
        return 0
    if args.command in ("context", "env"):
        from meshplane.cli.contexts import run_context

        return run_context(args)
    if args.command == "log":
        from meshplane.cli.log import run_log

        return run_log(args)
    if args.command == "shell":
        from meshplane.cli.shell import run_shell

        return run_shell(args)
    if args.command == "tls":
        from meshplane.cli.tls import run_tls

        return run_tls(args)
    if args.command == "pipeline":  # Spark runs its own threads and JVM: not inside an event loop
        from meshplane.cli.pipeline import run_pipeline_command

        return run_pipeline_command(args)
    from meshplane.cli.bench import run_bench
    from meshplane.cli.broker import run_broker, run_broker_stats
    from meshplane.cli.serve import run_serve
    from meshplane.cli.status import run_status
    from meshplane.cli.streams import run_client
    from meshplane.cli.up import run_up

    runner = {
        "status": run_status,
        "bench": run_bench,
        "up": run_up,
        "pub": run_pub,
        "sub": run_sub,
        "ls": run_ls,
        "broker": run_broker,
        "broker-stats": run_broker_stats,
        "serve": run_serve,
        "stream": run_client,
        "topic": run_client,
        "group": run_client,
        "mesh": run_client,
        "vpn": run_client,
    }[args.command]
    return runloop.run(runner(args))


if __name__ == "__main__":
    sys.exit(main())
