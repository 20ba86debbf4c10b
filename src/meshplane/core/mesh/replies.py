"""Replies to requests that crossed a service import (NATS's response mapping), sans I/O.

A request from VPN B to a service A exports carries, in A's space, a reply subject the importing node
made up (``_R_.<the node's space>.<token>``, nothing of B's); the first reply on it goes back to B's
own reply subject, and the token is forgotten (one reply per request, as nats-server's default
``singleton`` response). Tokens are random, so an A client that did not see the request cannot
answer it; they are kept at most ``ttl`` seconds, at most ``per_requester`` for one requester (past
it, its own oldest go) and at most ``capacity`` at once (past it, the oldest of the importing VPN holding
the most go), each drop counted: a requester that never hears back costs the node a bounded table, not a
leak, and one client's flood of requests drops its own tokens, not its VPN's other clients' or another
VPN's.
"""

from __future__ import annotations

import secrets
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

TOKEN_BYTES = 9  # 72 random bits: 12 characters of URL-safe base64, a valid subject token


@dataclass
class Replies:
    """Open requests by token: (the importing VPN, its requester's reply subject, when it expires)."""

    ttl: float = 60.0
    capacity: int = 10_000
    per_requester: int = 1_000
    counters: Counter[str] = field(default_factory=Counter)
    _open: OrderedDict[str, tuple[str, str, float, Hashable]] = field(default_factory=OrderedDict)
    _of: dict[str, dict[str, None]] = field(default_factory=dict)  # by VPN: its tokens, in order opened
    _by: dict[Hashable, dict[str, None]] = field(default_factory=dict)  # the same by requester

    def __len__(self) -> int:
        return len(self._open)

    def open(self, vpn: str, reply: str, now: float, requester: Hashable = None) -> str:
        """A token for a request of ``requester`` (its connection) whose reply goes to ``reply`` in
        ``vpn``."""
        self.expire(now)
        own = self._by.get(requester, {})
        while len(own) >= self.per_requester:
            self._forget(next(iter(own)))
            self.counters["reply_tokens_dropped_requester"] += 1
        while len(self._open) >= self.capacity:
            most = max(self._of.values(), key=len)
            self._forget(next(iter(most)))
            self.counters["reply_tokens_dropped_full"] += 1
        token = secrets.token_urlsafe(TOKEN_BYTES)  # no '.': one token of a subject
        self._open[token] = (vpn, reply, now + self.ttl, requester)
        self._of.setdefault(vpn, {})[token] = None
        self._by.setdefault(requester, {})[token] = None
        return token

    def _forget(self, token: str) -> tuple[str, str, float, Hashable] | None:
        found = self._open.pop(token, None)
        if found is not None:
            _drop(self._of, found[0], token)
            _drop(self._by, found[3], token)
        return found

    def close(self, token: str, now: float) -> tuple[str, str] | None:
        """Where the reply on ``token`` goes (once); None for a token unknown, answered or expired."""
        self.expire(now)
        found = self._forget(token)
        if found is None:
            self.counters["replies_unknown"] += 1
            return None
        self.counters["replies"] += 1
        return found[0], found[1]

    def expire(self, now: float) -> None:
        """Forget requests past their time (they were opened in order, so the oldest come first)."""
        while self._open:
            token, (_, _, deadline, _) = next(iter(self._open.items()))
            if deadline > now:
                return
            self._forget(token)
            self.counters["reply_tokens_expired"] += 1


def _drop(table: dict[Any, dict[str, None]], key: Hashable, token: str) -> None:
    mine = table[key]
    del mine[token]
    if not mine:
        del table[key]
