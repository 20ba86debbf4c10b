"""A node's Message VPNs, read from ``--mesh-vpns FILE`` (TOML):

```toml
[vpns.team-a]          # a VPN; "default" always exists (and takes users too: [vpns.default.users.x])
max_connections = 100  # its clients on one node, at most (a client past it is refused)
max_subscriptions = 10000  # patterns its clients hold on one node, at most (each one past it refused)
max_queues = 50        # its queues on one node, at most
max_spool_bytes = 104857600  # its guaranteed events in one node's spools for other nodes, unconfirmed
max_events_per_second = 10000  # its clients' publishes on one node: the excess refused, counted
max_bytes_per_second = 10485760  # ... and their bytes (each a token bucket with a second's burst)
dmr = true             # its events cross gateways to other clusters (false: they stay in this cluster)
max_topics = 100       # its streams topics (and max_partitions, max_rooms, max_groups): serve's flags' own
exports = [{ events = "orders.>", to = ["team-b"] }]  # what other VPNs may import (to: only these)
[vpns.team-a.users.alice]
max_connections = 5    # alice's clients on one node, at most
max_events_per_second = 1000  # her clients' publishes on one node (and max_bytes_per_second)
max_spool_bytes = 10485760  # her guaranteed events published on one node, in its spools for others
password_hash = "$argon2id$v=19$..."   # meshplane mesh hash-password (the password from stdin)
certificate = "CN=alice"  # ... or (and) a client certificate naming it (CN=, DNS=, email=, URI=, IP=)
queues = { create = { allow = ["orders-*"] }, read = { deny = ["*-audit"] } }  # and bind: queue names
publish = { allow = ["orders.>"], deny = ["orders.audit.>"] }
subscribe = { deny = ["orders.audit.>"] }
[vpns.team-b]
imports = [{ vpn = "team-a", events = "orders.>", prefix = "a" }]  # if team-a exports them (vpn_sharing.py)
```

Every node of a mesh is given the same file. A client names its VPN in its HELLO (``MeshClient(...,
vpn="team-a")``); a node refuses a VPN it does not have. A VPN with users admits a client only once
it logs in as one of them (``MeshClient(..., user="alice")``, the password from
``$MESHPLANE_MESH_PASSWORD``), and then holds it to that user's permissions
(:mod:`meshplane.core.mesh.permissions`). See :mod:`meshplane.core.mesh.vpn` for how VPNs are kept apart.

:func:`check_vpns` finds every mistake of a file, each with its line (``meshplane vpn check``); a node
reads its file again on SIGHUP (:mod:`meshplane.mesh.vpn_reload`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from meshplane.core.mesh.identity import CERTIFICATE_NAME_FORMS
from meshplane.core.mesh.imports import Export, Import
from meshplane.core.mesh.permissions import Permissions, Rules
from meshplane.core.mesh.queue_permissions import ACTIONS, NameRules, QueueRules
from meshplane.core.mesh.vpn import DEFAULT, check_vpn
from meshplane.errors import ConfigError
from meshplane.mesh.vpn_sharing import SHARING, Numbered, check_sharing, element_lines, parse_sharing

_hasher = PasswordHasher()


def hash_password(password: str) -> str:
    """An argon2id hash of ``password`` for a VPN file (argon2-cffi's default, RFC 9106 parameters)."""
    return _hasher.hash(password)


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str = field(repr=False)  # "": it logs in by its certificate only
    publish: Rules = field(default_factory=Rules)
    subscribe: Rules = field(default_factory=Rules)
    queues: QueueRules = field(default_factory=QueueRules)  # which queues it may create, bind, read
    certificate: str = ""  # a client certificate's name that logs in as it: "CN=...", "DNS=...", ...
    max_connections: int | None = None  # its clients on one node, at most
    max_subscriptions: int | None = None  # patterns its clients hold on one node, at most
    max_events_per_second: int | None = None  # its clients' publishes on one node
    max_bytes_per_second: int | None = None  # ... and their bytes
    max_spool_bytes: int | None = None  # its guaranteed events published on one node, in its spools

    def permissions(self) -> Permissions:
        """What a client logged in as this user is held to (its own, for its remembered decisions)."""
        return Permissions(self.publish, self.subscribe, self.queues)

    def password_ok(self, password: str) -> bool:
        """Whether ``password`` is this user's (slow on purpose: run it off the event loop)."""
        if not self.password_hash:
            return False
        try:
            return _hasher.verify(self.password_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False


@dataclass(frozen=True)
class Vpn:
    name: str
    users: dict[str, User] = field(default_factory=dict)
    max_connections: int | None = None  # its clients on one node, at most (None: the node's limit)
    max_subscriptions: int | None = None  # patterns its clients hold on one node, at most
    max_queues: int | None = None  # its queues on one node, at most
    max_spool_bytes: int | None = None  # its guaranteed events in one node's spools, unconfirmed, at most
    max_events_per_second: int | None = None  # its clients' publishes on one node (a burst of one second)
    max_bytes_per_second: int | None = None  # ... and their bytes
    # Its streams service's counts on this server (None: serve's --max-topics ... as each VPN's own).
    max_topics: int | None = None
    max_partitions: int | None = None
    max_rooms: int | None = None
    max_groups: int | None = None
    dmr: bool = True  # its interest and events cross gateways to other clusters (Solace's DMR switch)
    exports: tuple[Export, ...] = ()  # spaces of its subjects other VPNs may import
    imports: tuple[Import, ...] = ()  # spaces of other VPNs' subjects its clients see (vpn_sharing.py)

    def by_certificate(self, names: set[str]) -> list[User]:
        """The users a client certificate with ``names`` names (each user's certificate name is its
        own, but one certificate may hold several names): it logs in as the one, if one."""
        return [u for u in self.users.values() if u.certificate and u.certificate in names]

    def streams_limits(self) -> dict[str, int]:
        """The streams service's limits it sets (a ``StreamsConfig`` field each)."""
        return {key: value for key in STREAMS_LIMITS if (value := getattr(self, key)) is not None}


@dataclass(frozen=True)
class Vpns(Mapping[str, Vpn]):
    """The VPNs of a node, by name; ``default`` among them."""

    by_name: dict[str, Vpn] = field(default_factory=lambda: {DEFAULT: Vpn(DEFAULT)})

    def __getitem__(self, name: str) -> Vpn:
        return self.by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __len__(self) -> int:
        return len(self.by_name)


@dataclass(frozen=True)
class Problem:
    """One mistake in a VPN file: where (its line, the section) and what."""

    line: int
    where: str
    message: str

    def render(self, path: object) -> str:
        return f"{path}:{self.line}: {self.where}: {self.message}"


def check_vpns(text: str) -> tuple[Vpns, list[Problem]]:
    """The VPNs a TOML text declares (those without mistakes), and every mistake, with its line."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"line (\d+)", str(exc))
        return Vpns(), [Problem(int(at[1]) if at else 1, "syntax", f"not TOML: {exc}")]
    lines = key_lines(text)
    problems = _Problems(lines)
    for key in sorted(set(document) - {"vpns"}):
        problems.add((key,), f"[{key}]", "unknown key: only [vpns.NAME] sections")
    declared = document.get("vpns", {})
    if not isinstance(declared, dict):
        problems.add(("vpns",), "vpns", "must be a table of [vpns.NAME] sections")
        declared = {}
    by_name = {DEFAULT: Vpn(DEFAULT)}
    sharing: dict[str, Numbered] = {DEFAULT: ((), ())}
    shared_lines: dict[str, dict[str, list[int]]] = {DEFAULT: {}}
    for name, settings in declared.items():
        shared_lines[name] = {
            key: element_lines(text, lines[("vpns", name, key)], len(settings[key]))
            for key in SHARING
            if isinstance(settings, dict)
            and isinstance(settings.get(key), list)
            and ("vpns", name, key) in lines
        }
        sharing[name] = ((), ())
        vpn = _vpn(problems, name, settings, shared_lines[name], sharing)
        if vpn is not None:
            by_name[name] = vpn
    check_sharing(problems, sharing, shared_lines)
    return Vpns(by_name), sorted(problems.found, key=lambda problem: problem.line)


def streams_limits(vpns: Mapping[str, Vpn]) -> dict[str, dict[str, int]]:
    """The streams limits each VPN sets (``VpnEngines.limit``'s argument)."""
    return {name: vpn.streams_limits() for name, vpn in vpns.items()}


def parse_vpns(text: str, where: str = "the VPN file") -> Vpns:
    """The VPNs a TOML text declares; ConfigError naming the first mistake (and how many more)."""
    vpns, problems = check_vpns(text)
    if problems:
        more = f" and {len(problems) - 1} more (meshplane vpn check FILE lists them)" if problems[1:] else ""
        raise ConfigError(problems[0].render(where) + more)
    return vpns


LIMITS = (
    "max_connections",
    "max_subscriptions",
    "max_queues",
    "max_spool_bytes",
    "max_events_per_second",
    "max_bytes_per_second",
)

STREAMS_LIMITS = ("max_topics", "max_partitions", "max_rooms", "max_groups")

USER_LIMITS = (
    "max_connections",
    "max_subscriptions",
    "max_events_per_second",
    "max_bytes_per_second",
    "max_spool_bytes",
)


class _Problems:
    def __init__(self, lines: dict[tuple[str, ...], int]) -> None:
        self.lines = lines
        self.found: list[Problem] = []

    def add(self, path: tuple[str, ...], where: str, message: str, line: int | None = None) -> None:
        if line is None:
            line = next((self.lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in self.lines), 1)
        self.found.append(Problem(line, where, message))


def _vpn(
    problems: _Problems,
    name: str,
    settings: Any,
    lines: dict[str, list[int]],
    sharing: dict[str, Numbered],
) -> Vpn | None:
    path, where, before = ("vpns", name), f"[vpns.{name}]", len(problems.found)
    try:
        check_vpn(name)
    except ValueError as exc:
        problems.add(path, where, str(exc))
    if not isinstance(settings, dict):
        problems.add(path, where, f"must be a section ([vpns.{name}])")
        return None
    keys = ("users", "dmr", *SHARING, *LIMITS, *STREAMS_LIMITS)
    for key in sorted(set(settings) - set(keys)):
        problems.add((*path, key), where, f"unknown key {key!r} ({', '.join(keys)})")
    if not isinstance(settings.get("dmr", True), bool):
        problems.add((*path, "dmr"), where, "dmr: true (it crosses gateways, the default) or false")
    _limits(problems, path, where, settings, (*LIMITS, *STREAMS_LIMITS))
    users = settings.get("users", {})
    if not isinstance(users, dict):
        problems.add((*path, "users"), where, f"users must be sections ([vpns.{name}.users.NAME])")
        users = {}
    checked = {user: _user(problems, (*path, "users", user), user, u) for user, u in users.items()}
    holders: dict[str, str] = {}
    for user, u in checked.items():
        if u is not None and u.certificate:
            if u.certificate in holders:
                message = f"certificate {u.certificate!r} is user {holders[u.certificate]!r}'s already"
                problems.add((*path, "users", user, "certificate"), f"[vpns.{name}.users.{user}]", message)
            holders.setdefault(u.certificate, user)
    sharing[name] = parse_sharing(problems, path, where, settings, lines)
    if len(problems.found) > before:
        return None
    limits = {key: settings.get(key) for key in (*LIMITS, *STREAMS_LIMITS)}
    users_of = {user: u for user, u in checked.items() if u is not None}
    exports = tuple(export for _, export in sharing[name][0])
    imports = tuple(an_import for _, an_import in sharing[name][1])
    return Vpn(name, users_of, **limits, dmr=settings.get("dmr", True), exports=exports, imports=imports)


def _user(problems: _Problems, path: tuple[str, ...], name: str, settings: Any) -> User | None:
    where, before = "[" + ".".join(path) + "]", len(problems.found)
    if not isinstance(settings, dict):
        problems.add(path, where, "must be a section")
        return None
    if not name or len(name) > 64 or not name.isprintable():
        problems.add(path, where, "a user name is 1-64 printable characters")
    keys = ("password_hash", "certificate", "publish", "subscribe", "queues", *USER_LIMITS)
    for key in sorted(set(settings) - set(keys)):
        problems.add((*path, key), where, f"unknown key {key!r} ({', '.join(keys)})")
    _limits(problems, path, where, settings, USER_LIMITS)
    certificate = settings.get("certificate", "")
    form, _, named = certificate.partition("=") if isinstance(certificate, str) else ("", "", "")
    if certificate and (form not in CERTIFICATE_NAME_FORMS or not named):
        forms = ", ".join(f"{form}=..." for form in CERTIFICATE_NAME_FORMS)
        problems.add((*path, "certificate"), where, f"certificate names a client certificate's name: {forms}")
    password_hash = settings.get("password_hash", "" if certificate else None)
    if not isinstance(password_hash, str) or not (
        password_hash.startswith("$argon2") or (certificate and not password_hash)
    ):
        problems.add(
            (*path, "password_hash"),
            where,
            "password_hash must be an argon2 hash (meshplane mesh hash-password)"
            + (
                "" if certificate else ', unless the user logs in by its certificate (certificate = "CN=...")'
            ),
        )
    publish, subscribe = (_rules(problems, path, where, settings, d) for d in ("publish", "subscribe"))
    queues = _queue_rules(problems, path, where, settings)
    if len(problems.found) > before or publish is None or subscribe is None or queues is None:
        return None
    assert isinstance(password_hash, str)
    limits = {key: settings.get(key) for key in USER_LIMITS}
    assert isinstance(certificate, str)
    return User(name, password_hash, publish, subscribe, queues, certificate, **limits)


def _limits(
    problems: _Problems, path: tuple[str, ...], where: str, settings: dict[str, Any], keys: tuple[str, ...]
) -> None:
    for key in keys:
        value = settings.get(key)
        if value is not None and (type(value) is not int or value < 1):
            problems.add((*path, key), where, f"{key}: a whole number of 1 or more")


def _rules(
    problems: _Problems,
    path: tuple[str, ...],
    where: str,
    settings: dict[str, Any],
    direction: str,
    kind: type[Rules] | type[NameRules] = Rules,
) -> Any:
    """``settings[direction]``'s allow and deny lists as ``kind`` (None: a mistake, said)."""
    given = settings.get(direction, {})
    at = (*path, direction)
    if not isinstance(given, dict) or set(given) - {"allow", "deny"}:
        problems.add(at, where, f"{direction} takes allow and deny lists of patterns")
        return None
    lists = {key: given.get(key, []) for key in ("allow", "deny")}
    for key, patterns in lists.items():
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            problems.add(at, where, f"{direction}.{key} must be a list of patterns")
            return None
    try:
        return kind(tuple(lists["allow"]), tuple(lists["deny"]))
    except ValueError as exc:
        problems.add(at, where, f"{direction}: {exc}")
        return None


def _queue_rules(
    problems: _Problems, path: tuple[str, ...], where: str, settings: dict[str, Any]
) -> QueueRules | None:
    """``queues = { create = {allow, deny}, bind = ..., read = ... }``: patterns of queue names."""
    given = settings.get("queues", {})
    at = (*path, "queues")
    if not isinstance(given, dict) or set(given) - set(ACTIONS):
        problems.add(at, where, "queues takes create, bind and read, each with allow and deny lists")
        return None
    rules = {action: _rules(problems, at, where, given, action, NameRules) for action in given}
    if any(rule is None for rule in rules.values()):
        return None
    return QueueRules(**rules)


_KEY_PART = r'(?:[A-Za-z0-9_-]+|"[^"]*"|\'[^\']*\')'
_HEADER = re.compile(rf"^\s*\[\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]")
_KEY = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Where each section and key is first written, by its full path (tomllib gives no lines).
    Keys inside an inline table count at the line of the key that holds it."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        found = header or _KEY.match(line)
        if not found:
            continue
        parts = tuple(part.strip().strip("\"'") for part in re.findall(_KEY_PART, found[1]))
        path = parts if header else table + parts
        if header:
            table = parts
        for n in range(1, len(path) + 1):
            lines.setdefault(path[:n], number)
    return lines


def load_vpns(path: Path) -> Vpns:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--mesh-vpns {path}: cannot read it ({exc.strerror or exc})") from None
    return parse_vpns(text, str(path))
