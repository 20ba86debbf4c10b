"""A node's Message VPNs, read from ``--mesh-vpns FILE`` (TOML):

```toml
[vpns.team-a]          # a VPN; "default" always exists (and takes users too: [vpns.default.users.x])
max_connections = 100  # its clients on one node, at most (a client past it is refused)
max_subscriptions = 10000  # patterns its clients hold on one node, at most (each one past it refused)
[vpns.team-a.users.alice]
password_hash = "$argon2id$v=19$..."   # meshplane mesh hash-password (the password from stdin)
publish = { allow = ["orders.>"], deny = ["orders.audit.>"] }
subscribe = { deny = ["orders.audit.>"] }
[vpns.team-b]
```

Every node of a mesh is given the same file. A client names its VPN in its HELLO (``MeshClient(...,
vpn="team-a")``); a node refuses a VPN it does not have. A VPN with users admits a client only once
it logs in as one of them (``MeshClient(..., user="alice")``, the password from
``$MESHPLANE_MESH_PASSWORD``), and then holds it to that user's permissions
(:mod:`meshplane.core.mesh.permissions`). See :mod:`meshplane.core.mesh.vpn` for how VPNs are kept apart.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from meshplane.core.mesh.permissions import Rules
from meshplane.core.mesh.vpn import DEFAULT, check_vpn
from meshplane.errors import ConfigError

_hasher = PasswordHasher()


def hash_password(password: str) -> str:
    """An argon2id hash of ``password`` for a VPN file (argon2-cffi's default, RFC 9106 parameters)."""
    return _hasher.hash(password)


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str = field(repr=False)
    publish: Rules = field(default_factory=Rules)
    subscribe: Rules = field(default_factory=Rules)

    def password_ok(self, password: str) -> bool:
        """Whether ``password`` is this user's (slow on purpose: run it off the event loop)."""
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


def parse_vpns(text: str, where: str = "the VPN file") -> Vpns:
    """The VPNs a TOML text declares; ConfigError naming the first mistake."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not TOML: {exc}") from None
    unknown = set(document) - {"vpns"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}: only [vpns.NAME] sections")
    declared = document.get("vpns", {})
    if not isinstance(declared, dict):
        raise ConfigError(f"{where}: 'vpns' must be a table of [vpns.NAME] sections")
    by_name = {DEFAULT: Vpn(DEFAULT)}
    for name, settings in declared.items():
        try:
            check_vpn(name)
        except ValueError as exc:
            raise ConfigError(f"{where}: [vpns.{name}]: {exc}") from None
        if not isinstance(settings, dict):
            raise ConfigError(f"{where}: vpns.{name} must be a section ([vpns.{name}])")
        unknown = set(settings) - {"users", *LIMITS}
        if unknown:
            keys = ", ".join(("users", *LIMITS))
            raise ConfigError(f"{where}: [vpns.{name}]: unknown key(s) {sorted(unknown)} ({keys})")
        users = settings.get("users", {})
        if not isinstance(users, dict):
            raise ConfigError(f"{where}: vpns.{name}.users must be sections ([vpns.{name}.users.NAME])")
        for key in LIMITS:
            value = settings.get(key)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(f"{where}: [vpns.{name}] {key}: a whole number of 1 or more")
        by_name[name] = Vpn(
            name,
            {user: _user(f"{where}: [vpns.{name}.users.{user}]", user, u) for user, u in users.items()},
            **{key: settings.get(key) for key in LIMITS},
        )
    return Vpns(by_name)


LIMITS = ("max_connections", "max_subscriptions")


def _user(where: str, name: str, settings: Any) -> User:
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: must be a section")
    if not name or len(name) > 64 or not name.isprintable():
        raise ConfigError(f"{where}: a user name is 1-64 printable characters")
    unknown = set(settings) - {"password_hash", "publish", "subscribe"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} (password_hash, publish, subscribe)")
    password_hash = settings.get("password_hash")
    if not isinstance(password_hash, str) or not password_hash.startswith("$argon2"):
        raise ConfigError(f"{where}: password_hash must be an argon2 hash (meshplane mesh hash-password)")
    return User(name, password_hash, _rules(where, settings, "publish"), _rules(where, settings, "subscribe"))


def _rules(where: str, settings: dict[str, Any], direction: str) -> Rules:
    given = settings.get(direction, {})
    if not isinstance(given, dict) or set(given) - {"allow", "deny"}:
        raise ConfigError(f"{where}: {direction} takes allow and deny lists of patterns")
    lists = {key: given.get(key, []) for key in ("allow", "deny")}
    for key, patterns in lists.items():
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise ConfigError(f"{where}: {direction}.{key} must be a list of patterns")
    try:
        return Rules(tuple(lists["allow"]), tuple(lists["deny"]))
    except ValueError as exc:
        raise ConfigError(f"{where}: {direction}: {exc}") from None


def load_vpns(path: Path) -> Vpns:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--mesh-vpns {path}: cannot read it ({exc.strerror or exc})") from None
    return parse_vpns(text, str(path))
