"""``meshplane serve --config FILE``: serve's settings from a TOML file; ``meshplane config check`` and
``config show``.

Every serve flag has a key, named as the flag (``--max-topics`` is ``max_topics``), in the section of
its help group: ``[server]`` (or the top of the file), ``[limits]``, ``[mesh]`` (``--mesh-tls-cert``
is ``tls_cert``), ``[mesh_limits]`` (``--mesh-max-routes`` is ``max_routes``), and seed 004's
``[http]``, ``[nng]`` and ``[distributed_state]`` for the mesh's queue, batching and Bloom filter
settings. The environment, then flags, override the file. Secrets are never read from it: tokens
come from ``token_file``, the mesh secret and storage credentials from the environment.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import tomllib
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplane.cli.serve import STORAGE_ENV
from meshplane.cli.serve_rules import Broken, broken

#: seed 004's sections, by the key they hold
SEED_SECTIONS = {
    "max_message_queue_size": "http",
    "backpressure_policy": "http",
    "message_batch_size": "nng",
    "message_batch_timeout_ms": "nng",
    "bloom_filter_capacity": "distributed_state",
    "bloom_filter_fpr": "distributed_state",
}
#: help group titles (their first words) -> section
GROUP_SECTIONS = (
    ("mesh limits", "mesh_limits"),
    ("event mesh", "mesh"),
    ("limits", "limits"),
    ("nats door", "nats"),
    ("mqtt door", "mqtt"),
)
#: settings the environment sets too (and then wins over the file)
ENVIRONMENT = {"storage": STORAGE_ENV}
SECRET_KEYS = ("token", "secret", "password", "mesh_secret")
NOT_IN_FILE = {"help", "config"}


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    action: argparse.Action

    @property
    def flag(self) -> str:
        return self.action.option_strings[-1]


@dataclass(frozen=True)
class Problem:
    line: int | None
    where: str
    message: str

    def render(self, path: Path) -> str:
        return f"{path}:{self.line or 1}: {self.where}: {self.message}"


def settings_of(parser: argparse.ArgumentParser) -> dict[tuple[str, str], Setting]:
    """(section, key) -> the serve option it sets."""
    found: dict[tuple[str, str], Setting] = {}
    for group in parser._action_groups:
        title = (group.title or "").lower()
        section = next((s for prefix, s in GROUP_SECTIONS if title.startswith(prefix)), "server")
        for action in group._group_actions:
            if not action.option_strings or action.dest in NOT_IN_FILE or action.help == argparse.SUPPRESS:
                continue
            key = action.dest
            where = SEED_SECTIONS.get(key, section)
            if where in ("mesh", "mesh_limits") and key.startswith("mesh_"):
                key = key.removeprefix("mesh_")
            if where in ("nats", "mqtt"):
                key = key.removeprefix(f"{where}_")
            found[(where, key)] = Setting(where, key, action)
    return found


_KEY_PART = r'(?:[A-Za-z0-9_-]+|"[^"]*"|\'[^\']*\')'
_DOTTED = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")


def _key_path(dotted: str) -> list[str]:
    return [part.strip().strip("\"'") for part in re.findall(_KEY_PART, dotted)]


def key_lines(text: str) -> dict[tuple[str, str], int]:
    """Where each key (and section header, key "") is written: tomllib gives values, not lines.
    Dotted keys count where they are written: ``mesh.tls_cert = ...`` at the top is ``[mesh] tls_cert``."""
    lines: dict[tuple[str, str], int] = {}
    table: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(rf"^\s*\[\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]", line)
        if header:
            table = _key_path(header[1])
            lines.setdefault((table[0], ""), number)
            continue
        key = _DOTTED.match(line)
        if key:
            path = table + _key_path(key[1])
            if len(path) >= 2:
                lines.setdefault((path[0], ""), number)
            lines.setdefault((path[0], path[-1]) if len(path) >= 2 else ("server", path[0]), number)
    return lines


@dataclass
class ConfigFile:
    path: Path
    values: dict[str, Any]  # dest -> value as serve's parser would have made it
    lines: dict[str, int]  # dest -> line
    problems: list[Problem]


def read_config(path: Path, parser: argparse.ArgumentParser) -> ConfigFile:
    """Read and check ``path`` against serve's options; every problem found, not just the first."""
    result = ConfigFile(path, {}, {}, [])
    try:
        text = path.read_text()
    except OSError as exc:
        result.problems.append(Problem(None, "file", f"cannot read it: {exc.strerror or exc}"))
        return result
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"line (\d+)", str(exc))
        result.problems.append(Problem(int(at[1]) if at else None, "syntax", f"not TOML: {exc}"))
        return result
    known = settings_of(parser)
    lines = key_lines(text)
    sections = sorted({section for section, _ in known})
    entries: list[tuple[str, str, Any]] = []
    for name, value in document.items():
        if isinstance(value, dict):
            if name not in sections:
                near = difflib.get_close_matches(name, sections, n=1)
                hint = f" (did you mean [{near[0]}]?)" if near else f" (sections: {', '.join(sections)})"
                result.problems.append(Problem(lines.get((name, "")), f"[{name}]", f"unknown section{hint}"))
                continue
            entries += [(name, key, item) for key, item in value.items()]
        else:
            entries.append(("server", name, value))
    for section, key, value in entries:
        line = lines.get((section, key))
        where = f"[{section}] {key}"
        setting = known.get((section, key))
        if key in SECRET_KEYS or key.endswith(("_token", "_secret", "_password")):
            result.problems.append(Problem(line, where, _SECRET))
        elif setting is None:
            result.problems.append(Problem(line, where, _unknown(section, key, known)))
        else:
            try:
                result.values[setting.action.dest] = convert(setting.action, value)
                result.lines[setting.action.dest] = line or 1
            except ValueError as exc:
                result.problems.append(Problem(line, where, str(exc)))
    result.problems.sort(key=lambda problem: problem.line or 0)
    return result


_SECRET = (
    "secrets are not read from the config file: tokens come from token_file, the mesh secrets from "
    "$MESHPLANE_MESH_MEMBER_SECRET and $MESHPLANE_MESH_CLIENT_SECRET"
)


def _unknown(section: str, key: str, known: dict[tuple[str, str], Setting]) -> str:
    elsewhere = [s for s, k in known if k == key]
    if elsewhere:
        return f"unknown key in [{section}]: it belongs in [{elsewhere[0]}]"
    near = difflib.get_close_matches(key, [k for s, k in known if s == section], n=1)
    return "unknown key" + (f" (did you mean {near[0]}?)" if near else "")


def convert(action: argparse.Action, value: Any) -> Any:
    """``value`` as serve's parser would have made it from the flag, or ValueError saying why not."""
    if action.nargs == 0:  # a switch
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, not {value!r}")
        return value if action.const is True else not value
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_one(action, item) for item in items]
    if isinstance(value, list):  # a comma-separated flag written as a TOML array
        value = ",".join(str(item) for item in value)
    return _one(action, value)


def _holds_credentials(text: str) -> bool:
    """Any URL of a comma-separated list with a user or password (``nats://s3cr3t@host``: a token)."""
    for part in text.split(","):
        if "://" not in part:
            continue
        try:
            parts = urllib.parse.urlsplit(part.strip())
        except ValueError:
            continue
        if parts.username or parts.password:
            return True
    return False


def _one(action: argparse.Action, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a {'string' if action.type in (None, Path) else 'number'}, not {value!r}")
    if isinstance(value, str) and _holds_credentials(value):
        where = f"${ENVIRONMENT[action.dest]}" if action.dest in ENVIRONMENT else "the environment"
        raise ValueError(f"a URL holds credentials: they go in {where}, not in the config file")
    text = str(value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise ValueError(f"{text!r} is not valid for {action.option_strings[-1]} ({exc})") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"{converted!r} is not one of {choices}")
    return converted


def file_name(parser: argparse.ArgumentParser) -> Callable[[str], str]:
    """dest -> ``[section] key``, as a file names it."""
    keys = {setting.action.dest: (section, key) for (section, key), setting in settings_of(parser).items()}
    return lambda dest: "[{}] {}".format(*keys[dest]) if dest in keys else dest


def flag_name(parser: argparse.ArgumentParser) -> Callable[[str], str]:
    flags = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
    return lambda dest: flags.get(dest, dest)


def broken_in_file(parser: argparse.ArgumentParser, config: ConfigFile) -> list[Problem]:
    """What ``serve`` would refuse in this file's settings (the rest at their defaults), in its terms."""
    settings = parser.parse_args([])
    settings.storage = "local"  # the file alone: not $MESHPLANE_STREAMS_STORAGE, which serve checks itself
    for dest, value in config.values.items():
        setattr(settings, dest, value)
    name = file_name(parser)
    return [_problem(config, found, name) for found in broken(settings, name)]


def _problem(config: ConfigFile, found: Broken, name: Callable[[str], str]) -> Problem:
    """A rule's message as a file's problem: at the setting's line, each section said once
    (``[mesh] tls_cert: needs tls_key``)."""
    where = name(found.dest)
    message = found.message.removeprefix(where).strip()
    for section in set(re.findall(r"\[[a-z_]+\] ", found.message)):
        message = message.replace(section, "") if where.startswith(section) else message
    return Problem(config.lines.get(found.dest), where, message)


def refuse_broken(
    parser: argparse.ArgumentParser, args: argparse.Namespace, config: ConfigFile | None, argv: list[str]
) -> None:
    """Stop ``serve`` at the first rule its settings break, named as they were given: with a file, its
    keys (and the line) except for the settings given as flags."""
    from meshplane.cli.errors import CliError

    flagged = {a.dest for a in parser._actions if a.option_strings and flags_given(argv, a)}
    from_file = set(config.values) - flagged if config is not None else set()
    in_file, flag = file_name(parser), flag_name(parser)

    def name(dest: str) -> str:
        return in_file(dest) if config is not None and dest not in flagged else flag(dest)

    found = broken(args, name)
    if not found:
        return
    if config is not None and found[0].dest in from_file:
        problem = _problem(config, found[0], name)
        raise CliError(
            f"{problem.render(config.path)} (meshplane config check {config.path} lists every one)"
        )
    raise CliError(found[0].message)


def flags_given(argv: list[str], action: argparse.Action) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv for flag in action.option_strings)


def apply_to(parser: argparse.ArgumentParser, config: ConfigFile) -> dict[str, str]:
    """Make the file's values serve's defaults (flags still win), except where the environment sets the
    same setting. Returns what the environment kept: dest -> variable."""
    kept = {dest: ENVIRONMENT[dest] for dest in config.values if os.environ.get(ENVIRONMENT.get(dest, ""))}
    parser.set_defaults(**{dest: value for dest, value in config.values.items() if dest not in kept})
    return kept


# --- meshplane config check | show ------------------------------------------------------------------


def add_config_commands(commands: Any) -> None:
    config = commands.add_parser(
        "config",
        help="check a serve config file, or show the settings serve would run with and where each comes from",
        description="A TOML file for `meshplane serve --config FILE`: every serve flag is a key named as the "
        "flag (--max-topics is max_topics) in the section of its help group: [server] (or the top of the "
        "file), [limits], [mesh] (--mesh-tls-cert is tls_cert), [mesh_limits] (--mesh-max-routes is "
        "max_routes), and seed 004's [http], [nng] and [distributed_state]. The environment, then flags, "
        "override the file. Secrets are never read from it.",
    )
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="check FILE: one line per problem, with its line and key")
    check.add_argument("file", type=Path, help="a TOML file for serve --config")
    show = actions.add_parser(
        "show",
        help="the effective settings of `serve [--config FILE] [FLAGS]`, as TOML, each with its source",
    )
    show.add_argument("file", type=Path, nargs="?", help="a TOML file for serve --config (default: none)")
    show.add_argument("flags", nargs=argparse.REMAINDER, help="serve's flags, as they would be given")


def load_for_serve(serve: argparse.ArgumentParser, path: Path) -> ConfigFile:
    """Read ``path`` for serve and make its values serve's defaults; refuse a file with problems."""
    from meshplane.cli.errors import CliError

    config = read_config(path, serve)
    if config.problems:
        first = config.problems[0].render(path)
        more = f" and {len(config.problems) - 1} more" if len(config.problems) > 1 else ""
        raise CliError(f"{first}{more} (meshplane config check {path} lists every problem)")
    apply_to(serve, config)
    return config


def run_config(args: argparse.Namespace, serve: argparse.ArgumentParser) -> int:
    from meshplane.cli.errors import EXIT_BAD_INPUT
    from meshplane.cli.vpn import check_file, check_token_file

    if args.action == "check":
        checked = read_config(args.file, serve)
        if not checked.problems:  # each setting is right alone: and together?
            checked.problems += broken_in_file(serve, checked)
        for problem in checked.problems:
            print(problem.render(args.file))
        vpns = checked.values.get("mesh_vpns")  # the VPN file it names: every mistake there too
        if vpns is not None and check_file(Path(vpns)):
            return EXIT_BAD_INPUT
        tokens = checked.values.get("token_file")  # and the token file's, each token's VPN among them
        if tokens is not None and check_token_file(Path(tokens), Path(vpns) if vpns is not None else None):
            return EXIT_BAD_INPUT
        if checked.problems:
            return EXIT_BAD_INPUT
        print(f"{args.file}: {len(checked.values)} setting(s), no problems")
        return 0
    config = load_for_serve(serve, args.file) if args.file is not None else None
    flags = [flag for flag in args.flags if flag != "--"]
    effective = serve.parse_args(flags)
    by_section: dict[str, list[str]] = {}
    for (section, key), setting in settings_of(serve).items():
        dest = setting.action.dest
        value = getattr(effective, dest, None)
        variable = ENVIRONMENT.get(dest)
        if flags_given(flags, setting.action):
            source = f"flag {setting.flag}"
        elif variable and os.environ.get(variable):
            source = f"${variable}"
        elif config is not None and dest in config.values:
            source = f"{config.path}:{config.lines[dest]}"
        else:
            source = "default"
        written = _toml(value, dest)
        line = f"{key} = {written}" if written is not None else f"# {key} is not set"
        if source.startswith("$"):  # it stays there: a file with it would hold credentials
            line = "# " + line
        by_section.setdefault(section, []).append(f"{line}  # {source}")
    for section, lines in by_section.items():
        print(f"[{section}]")
        print("\n".join(lines) + "\n")
    return 0


def _toml(value: Any, dest: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple):
        items = [_toml("=".join(v) if isinstance(v, tuple) else v, dest) for v in value]
        return "[" + ", ".join(i for i in items if i is not None) + "]"
    text = str(value)
    if dest == "storage":
        from meshplane.core.urls import redact_url

        text = redact_url(text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
