"""What a streams token grants: scopes of read / write / admin per name prefix, in one Message VPN
(:mod:`.access` checks presented tokens against them; :mod:`.token_file` reads them)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from meshplane.core.mesh.vpn import DEFAULT
from meshplane.errors import ConfigError

Level = Literal["read", "write", "admin"]
RANK: dict[str, int] = {"read": 0, "write": 1, "admin": 2}


@dataclass(frozen=True, slots=True)
class Scope:
    level: Level
    prefix: str = ""

    def allows(self, level: Level, name: str | None) -> bool:
        if RANK[self.level] < RANK[level]:
            return False
        # Unnamed operations (listings, metrics) need a scope over every name, except to read.
        return self.prefix == "" or level == "read" if name is None else name.startswith(self.prefix)


@dataclass(frozen=True, slots=True)
class Grant:
    """What one presented token may do."""

    scopes: tuple[Scope, ...]
    holder: str = ""  # a fingerprint of the token (never the token): whose a reader view is
    vpn: str = DEFAULT  # the Message VPN whose rooms, topics and groups it names (and only those)

    def allows(self, level: Level, names: Iterable[str | None] = (None,)) -> bool:
        return all(any(s.allows(level, name) for s in self.scopes) for name in names)

    @property
    def operator(self) -> bool:
        """The server's operator: an admin over every name of the default VPN, who may also work in
        any other VPN (the ``X-Meshplane-Vpn`` header, the dashboard's VPN picker)."""
        return self.vpn == DEFAULT and any(s.level == "admin" and s.prefix == "" for s in self.scopes)


ADMIN = Grant((Scope("admin"),))


def holder(token: str) -> str:
    """A short fingerprint of a token, to tell its holders apart in listings without showing it."""
    return "t" + hashlib.sha256(token.encode()).hexdigest()[:10]


def parse_scope(text: str) -> Scope:
    level, _, prefix = text.partition(":")
    if level not in RANK:
        raise ConfigError(f"unknown scope {text!r}: read, write or admin, optionally :PREFIX")
    return Scope(level, prefix)  # type: ignore[arg-type]
