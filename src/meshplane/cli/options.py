"""Options shared by the commands: how to reach the event plane."""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path
from typing import Any

from meshplane.cli.errors import CliError
from meshplane.config import PlaneConfig
from meshplane.core.brokers import parse_broker_url
from meshplane.core.envelope import Codec
from meshplane.core.framing import WireFormat
from meshplane.core.names import Scope


def add_plane_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("event plane (each defaults to its environment variable)")
    g.add_argument(
        "--transport",
        choices=["nats", "zmq", "mesh"],
        help="transport: nats (NATS core), zmq (ZeroMQ direct) or mesh (a mesh node). Env DYN_EVENT_PLANE, "
        "default nats",
    )
    g.add_argument(
        "--mesh-node",
        metavar="URL",
        help="with mesh: the node, e.g. tcp://127.0.0.1:16500. Env MESHPLANE_NODE",
    )
    g.add_argument(
        "--vpn",
        metavar="NAME",
        help="with mesh: the Message VPN to publish and subscribe in. Env MESHPLANE_VPN",
    )
    g.add_argument(
        "--mesh-user",
        metavar="NAME",
        help="with mesh: log in to the VPN as this user (the password from $MESHPLANE_MESH_PASSWORD, "
        "never argv). Env MESHPLANE_MESH_USER",
    )
    g.add_argument(
        "--nats-server", metavar="URL", help="NATS server URL, e.g. nats://127.0.0.1:4222. Env NATS_SERVER"
    )
    g.add_argument(
        "--discovery",
        choices=["etcd", "file", "mem"],
        help="discovery backend. Env DYN_DISCOVERY_BACKEND, default file (etcd if ETCD_ENDPOINTS is set)",
    )
    g.add_argument(
        "--file-kv",
        metavar="DIR",
        type=Path,
        help="folder of the file discovery backend. Env DYN_FILE_KV, default ~/.local/state/meshplane/kv",
    )
    g.add_argument(
        "--etcd-endpoints",
        metavar="LIST",
        help="comma-separated etcd endpoints, e.g. http://127.0.0.1:2379. Env ETCD_ENDPOINTS",
    )
    g.add_argument(
        "--host",
        metavar="HOST",
        help="address ZeroMQ publishers bind and advertise. Env DYN_EVENT_PLANE_HOST, default 127.0.0.1",
    )
    g.add_argument(
        "--broker-url",
        metavar="URL",
        help="ZeroMQ broker mode through these brokers: 'xsub=tcp://h:5555;tcp://h2:5555 , "
        "xpub=tcp://h:5556;tcp://h2:5556'. Env DYN_ZMQ_BROKER_URL",
    )
    g.add_argument(
        "--brokers-from-discovery",
        action="store_true",
        default=None,
        help="ZeroMQ broker mode through the brokers registered in discovery. Env DYN_ZMQ_BROKER_ENABLED",
    )
    g.add_argument(
        "--wire",
        choices=[*(w.value for w in WireFormat), "seed"],
        help="layout publishers send: dynamo (4 frames, Dynamo 1.6.1) or header8 (8-byte header, was: seed). "
        "Receivers accept both. Env MESHPLANE_WIRE_FORMAT, default dynamo",
    )
    g.add_argument(
        "--codec",
        choices=[c.name.lower() for c in Codec],
        help="envelope codec of the 8-byte-header layout. Env MESHPLANE_CODEC, default msgpack",
    )


def config_from_args(args: argparse.Namespace) -> PlaneConfig:
    return PlaneConfig.from_env(
        event_plane=args.transport,
        nats_server=args.nats_server,
        mesh_node=args.mesh_node,
        mesh_vpn=args.vpn,
        mesh_user=args.mesh_user,
        discovery_backend=args.discovery,
        file_kv=args.file_kv,
        etcd_endpoints=tuple(e.strip() for e in args.etcd_endpoints.split(","))
        if args.etcd_endpoints
        else None,
        host=args.host,
        wire_format=WireFormat(args.wire) if args.wire else None,
        codec=Codec[args.codec.upper()] if args.codec else None,
        zmq_brokers=parse_broker_url(args.broker_url) if args.broker_url else None,
        zmq_broker_enabled=args.brokers_from_discovery,
    )


def scope_arg(text: str) -> Scope:
    try:
        return Scope.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _ReadTokenFile(argparse.Action):
    """Stores the token read from the file given (the default, from the environment, is the token)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any, _: Any = None
    ) -> None:
        from meshplane.errors import ConfigError
        from meshplane.streams.access import read_token_file

        try:
            setattr(namespace, self.dest, read_token_file(Path(value)))
        except ConfigError as exc:
            parser.error(f"--token-file: {exc}")


def add_token_option(parser: argparse.ArgumentParser, env: str, what: str) -> None:
    """``--token-file FILE`` (its first word), else ``$env``: a token never goes on the command line,
    where ``ps`` and shell histories show it. The value lands in ``args.token``."""
    parser.add_argument(
        "--token-file",
        dest="token",
        action=_ReadTokenFile,
        default=os.environ.get(env),
        metavar="FILE",
        help=f"{what}: read from FILE (default: ${env})",
    )


def require_discovery_folder(config: PlaneConfig) -> None:
    """A command that only reads file discovery must not create its folder (an empty table, exit 0, for a
    mistyped path, and a stray folder left behind)."""
    if config.discovery_backend == "file" and not config.file_kv.is_dir():
        raise CliError(
            f"the discovery folder {config.file_kv} does not exist: nothing has registered there "
            "(publishers write where their DYN_FILE_KV points)"
        )


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Says an option's default once: only when it has one and its help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        nothing = default in (None, False, argparse.SUPPRESS) or default in ([], ())
        if "default" in text.lower() or nothing or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def parse_with_suggestions(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parse_args``, but an unknown option is reported by the command it was given to, with its usage
    and the nearest option it has ("did you mean --partition?"), not by the top-level parser."""
    args, extras = parser.parse_known_args(argv)
    if not extras:
        return args
    command = parser
    for name in ("command", "action"):
        chosen = getattr(args, name, None)
        children = subcommands(command)
        if chosen is None or chosen not in children:
            break
        command = children[chosen]
    known = [option for action in command._actions for option in action.option_strings]
    message = f"unrecognized arguments: {' '.join(extras)}"
    for extra in extras:
        if extra.startswith("-"):
            near = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.6)
            if near:
                message += f" (did you mean {near[0]}?)"
                break
    command.error(message)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
