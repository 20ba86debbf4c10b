"""Who may do what on the streams server: tokens, each with scopes of read / write / admin per name
prefix (room, topic, group or pub/sub subject).

A token file has one token a line, then its scopes (none: ``admin``, everything)::

    # token                           scopes
    4f0c...e1                         admin
    9a77...02                         write:orders. read:orders.
    c3d1...5b                         vpn:team-a read

(``vpn:NAME``: the token's Message VPN, else ``default``; a TOML form too: :mod:`.token_file`.)

``read`` covers reading, subscribing, consumer-group membership and commits; ``write`` adds
publishing (and rooms made by a publish); ``admin`` adds creating and deleting topics, rooms and
groups. A scope's prefix limits it to names that start with it. Tokens come from a file or the
environment, never from the command line (where ``ps`` shows them).
"""

from __future__ import annotations

import hmac
from collections.abc import Collection
from pathlib import Path

from meshplane.errors import ConfigError
from meshplane.streams.grants import ADMIN, Grant, holder
from meshplane.streams.token_file import parse_tokens


class Tokens:
    """The accepted tokens and their grants; a lookup compares in constant time against each."""

    def __init__(self, grants: dict[str, Grant]) -> None:
        if not grants:
            raise ConfigError("no tokens given")
        self._grants = [(token.encode(), grant) for token, grant in grants.items()]

    @classmethod
    def parse(cls, text: str) -> Tokens:
        """The tokens of a token file's lines (:mod:`.token_file`)."""
        return cls(parse_tokens(text, toml=False, vpns=None, where="token file"))

    @classmethod
    def load(
        cls, token_file: Path | None, env_token: str | None, vpns: Collection[str] | None = None
    ) -> Tokens | None:
        """Tokens from ``token_file`` (lines, or TOML if its name ends in ``.toml``) and/or one admin
        token of the default VPN from the environment; None: no auth. ``vpns``: the server's VPNs (a
        token naming another is refused, with its line)."""
        grants: dict[str, Grant] = {}
        if token_file is not None:
            try:
                text = token_file.read_text()
            except OSError as exc:
                raise ConfigError(f"cannot read the token file {token_file}: {exc.strerror}") from None
            grants.update(
                parse_tokens(text, toml=token_file.suffix == ".toml", vpns=vpns, where=str(token_file))
            )
        if env_token:
            grants[env_token] = Grant(ADMIN.scopes, holder(env_token))
        return cls(grants) if grants else None

    def vpns(self) -> set[str]:
        """The Message VPNs the tokens belong to."""
        return {grant.vpn for _, grant in self._grants}

    def grant_for(self, presented: str) -> Grant | None:
        found: Grant | None = None
        raw = presented.encode()
        for token, grant in self._grants:  # every comparison is made: timing tells nothing
            if hmac.compare_digest(raw, token):
                found = grant
        return found


def read_token_file(path: Path | None) -> str | None:
    """A client's token: the first word of ``path`` (for commands that send one token)."""
    if path is None:
        return None
    try:
        words = path.read_text().split()
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror}") from None
    if not words:
        raise ConfigError(f"the token file {path} is empty")
    return words[0]
