"""The streams server's token file, in either of two forms, each token with its scopes and its VPN.

Lines (the first form; ``vpn:NAME`` puts a token in a Message VPN, else it is the default VPN's)::

    # token                           scopes
    4f0c...e1                         admin
    9a77...02                         vpn:team-a write:orders. read:orders.

TOML, for a file whose name ends in ``.toml``::

    [tokens.ingest]           # a name for the token, said in mistakes (never the token)
    token = "9a77...02"
    vpn = "team-a"            # default: "default"
    scopes = ["write:orders.", "read:orders."]   # default: ["admin"]

A token's VPN is where its rooms, topics and groups are: it names them, lists them and sees their lag
and metrics there, and nowhere else (:mod:`meshplane.streams.vpn_engines`). :func:`check_tokens`
finds every mistake of a file with its line, a VPN the server does not have included.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from meshplane.core.mesh.vpn import DEFAULT, check_vpn
from meshplane.errors import ConfigError
from meshplane.streams.grants import ADMIN, Grant, holder, parse_scope

MIN_TOKEN = 16
_VPN_WORD = "vpn:"


@dataclass(frozen=True)
class Entry:
    line: int
    token: str
    grant: Grant


@dataclass(frozen=True)
class Problem:
    line: int
    message: str

    def render(self, path: object) -> str:
        return f"{path}:{self.line}: {self.message}"


def check_tokens(
    text: str, *, toml: bool, vpns: Collection[str] | None = None
) -> tuple[list[Entry], list[Problem]]:
    """The tokens a file declares and every mistake in it, each with its line; ``vpns``: the VPNs the
    server has (None: do not check)."""
    entries, problems = _toml(text) if toml else _lines(text)
    for entry in entries:
        if vpns is not None and entry.grant.vpn not in vpns:
            known = ", ".join(sorted(vpns))
            problems.append(Problem(entry.line, f"unknown VPN {entry.grant.vpn!r} (the server has: {known})"))
    return entries, sorted(problems, key=lambda problem: problem.line)


def parse_tokens(text: str, *, toml: bool, vpns: Collection[str] | None, where: str) -> dict[str, Grant]:
    """token -> grant; ConfigError naming the first mistake with its line."""
    entries, problems = check_tokens(text, toml=toml, vpns=vpns)
    if problems:
        more = f" and {len(problems) - 1} more" if problems[1:] else ""
        raise ConfigError(problems[0].render(where) + more)
    return {entry.token: entry.grant for entry in entries}


def _grant(token: str, scopes: list[str], vpn: str) -> Grant:
    made = tuple(parse_scope(s) for s in scopes) if scopes else ADMIN.scopes
    return Grant(made, holder(token), check_vpn_or_raise(vpn))


def check_vpn_or_raise(vpn: str) -> str:
    try:
        return check_vpn(vpn)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _lines(text: str) -> tuple[list[Entry], list[Problem]]:
    entries: list[Entry] = []
    problems: list[Problem] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        token, rest = words[0], words[1:]
        vpns = [word[len(_VPN_WORD) :] for word in rest if word.startswith(_VPN_WORD)]
        scopes = [word for word in rest if not word.startswith(_VPN_WORD)]
        if len(token) < MIN_TOKEN:
            problems.append(Problem(number, f"a token must have at least {MIN_TOKEN} characters"))
            continue
        if len(vpns) > 1:
            problems.append(Problem(number, "a token belongs to one VPN: one vpn:NAME at most"))
            continue
        try:
            entries.append(Entry(number, token, _grant(token, scopes, vpns[0] if vpns else DEFAULT)))
        except ConfigError as exc:
            problems.append(Problem(number, str(exc)))
    return entries, problems


def _toml(text: str) -> tuple[list[Entry], list[Problem]]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return [], [Problem(getattr(exc, "lineno", 1) or 1, f"not TOML: {exc}")]
    lines = _key_lines(text)
    entries: list[Entry] = []
    problems: list[Problem] = []
    for key in sorted(set(document) - {"tokens"}):
        problems.append(Problem(lines.get((key,), 1), f"unknown key {key!r}: only [tokens.NAME] sections"))
    tokens: Any = document.get("tokens", {})
    if not isinstance(tokens, dict):
        return entries, [
            *problems,
            Problem(lines.get(("tokens",), 1), "tokens must be [tokens.NAME] sections"),
        ]
    for name, settings in tokens.items():
        line = lines.get(("tokens", name), 1)
        where = f"[tokens.{name}]"
        if not isinstance(settings, dict):
            problems.append(Problem(line, f"{where} must be a section"))
            continue
        for key in sorted(set(settings) - {"token", "vpn", "scopes"}):
            problems.append(Problem(lines.get(("tokens", name, key), line), f"{where}: unknown key {key!r}"))
        token, vpn, scopes = settings.get("token"), settings.get("vpn", DEFAULT), settings.get("scopes", [])
        if not isinstance(token, str) or len(token) < MIN_TOKEN:
            at = lines.get(("tokens", name, "token"), line)
            problems.append(
                Problem(at, f"{where}: token must be a string of at least {MIN_TOKEN} characters")
            )
            continue
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            problems.append(
                Problem(lines.get(("tokens", name, "scopes"), line), f"{where}: scopes is a list")
            )
            continue
        if not isinstance(vpn, str):
            problems.append(Problem(lines.get(("tokens", name, "vpn"), line), f"{where}: vpn is a name"))
            continue
        try:
            entries.append(Entry(lines.get(("tokens", name, "vpn"), line), token, _grant(token, scopes, vpn)))
        except ConfigError as exc:
            problems.append(Problem(line, f"{where}: {exc}"))
    return entries, problems


_HEADER = re.compile(r"""^\s*\[\s*(\w+)\s*(?:\.\s*("[^"]*"|'[^']*'|[\w-]+)\s*)?\]""")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[\w-]+)\s*=""")


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Where each section and key of this file's flat schema is first written (tomllib gives no lines)."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        header, key = _HEADER.match(line), _KEY.match(line)
        if header:
            table = tuple(part.strip("\"'") for part in header.groups() if part is not None)
            lines.setdefault(table[:1], number)
            lines.setdefault(table, number)
        elif key:
            lines.setdefault((*table, key[1].strip("\"'")), number)
    return lines
