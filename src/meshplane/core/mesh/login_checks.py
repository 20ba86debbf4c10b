"""Which password checks run next: a bounded queue shared fairly by source address and by user.

A password check (argon2: tens of milliseconds, tens of MiB) is the one costly thing a client that
holds the clients' secret can make a node do before it is anyone. Checks run a few at a time
(``slots``); the rest wait here. Without fairness a flood of wrong passwords from one place keeps
every other login waiting behind it. So:

- one source address runs at most ``per_address`` checks at once, and one user name at most
  ``per_user``: with fewer than ``slots`` each, no address and no user name can take every slot;
- a free slot goes to the address that has waited longest since its last check started (round
  robin: an address that just started one goes behind every other waiting address), and within an
  address to its oldest check whose user is under its bound;
- at most ``queued`` checks wait in all and ``queued_per_address`` per address: a check past either is
  refused at once (its reason given, the caller counts and answers it), never left to wait unbounded.

Invariants (tests/unit/test_login_checks.py drives them with hypothesis): running checks never pass
``slots``, ``per_address`` or ``per_user``; waiting ones never pass ``queued`` or
``queued_per_address``; no slot is left free while a waiting check could take it; and between the
time a check of address A becomes startable and its start, every other address starts at most one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

WRONG = "wrong user or password"  # a refusal the client does not retry: the same answer would come
# Begins a refusal of a session that sent no LOGIN (its certificate names no user): the client stops
# dialling. Any other (a limit: its user's or VPN's clients) it retries, as the room may come.
LOGIN_FIRST = "log in first"
RETRY_LATER = "try again later"  # ends a refusal the client retries (with backoff, within its timeout)
QUEUE_FULL = f"the node is busy checking logins: {RETRY_LATER}"
ADDRESS_BUSY = f"too many logins from your address are waiting to be checked: {RETRY_LATER}"


@dataclass(frozen=True)
class CheckLimits:
    slots: int = 2  # checks at once, in all
    per_address: int = 1  # checks at once from one source address
    per_user: int = 1  # checks at once of one user name
    queued: int = 256  # checks waiting, in all
    queued_per_address: int = 8  # checks waiting from one source address

    def __post_init__(self) -> None:
        if min(self.slots, self.per_address, self.per_user, self.queued, self.queued_per_address) < 1:
            raise ValueError("login check limits are whole numbers of 1 or more")


@dataclass
class _Check(Generic[T]):
    who: T
    address: str
    user: str


class LoginChecks(Generic[T]):
    """The checks waiting and running, by the connection (``who``) each is for."""

    def __init__(self, limits: CheckLimits | None = None) -> None:
        self.limits = limits or CheckLimits()
        self._waiting: dict[str, dict[T, _Check[T]]] = {}  # by address, oldest first
        self._running: dict[T, _Check[T]] = {}
        self._running_by_address: Counter[str] = Counter()
        self._running_by_user: Counter[str] = Counter()
        self._last_start: dict[str, int] = {}  # by waiting address: when it last started a check
        self._clock = itertools.count(1)
        self.waiting = 0

    @property
    def running(self) -> int:
        return len(self._running)

    def offer(self, who: T, address: str, user: str) -> str:
        """Queue a check for ``who``: "" (it waits; :meth:`start` says when it runs), or why it is
        refused (nothing is kept of it)."""
        limits = self.limits
        queue = self._waiting.get(address)
        if queue is not None and len(queue) >= limits.queued_per_address:
            return ADDRESS_BUSY
        if self.waiting >= limits.queued:
            return QUEUE_FULL
        if queue is None:
            queue = self._waiting[address] = {}
            self._last_start.setdefault(address, 0)  # never started one: first in line
        queue[who] = _Check(who, address, user)
        self.waiting += 1
        return ""

    def cancel(self, who: T) -> None:
        """``who`` is gone: its waiting check is dropped, or its running one's slot freed."""
        if who in self._running:
            return self.done(who)
        for address, queue in self._waiting.items():
            if queue.pop(who, None) is not None:
                self.waiting -= 1
                if not queue:
                    self._forget(address)
                return

    def done(self, who: T) -> None:
        check = self._running.pop(who, None)
        if check is not None:
            self._running_by_address[check.address] -= 1
            self._running_by_user[check.user] -= 1
            if not self._running_by_address[check.address]:
                del self._running_by_address[check.address]
                if check.address not in self._waiting:
                    self._last_start.pop(check.address, None)
            if not self._running_by_user[check.user]:
                del self._running_by_user[check.user]

    def start(self) -> list[T]:
        """The checks to run now (each one counted as running until :meth:`done` or :meth:`cancel`)."""
        started: list[T] = []
        limits = self.limits
        while len(self._running) < limits.slots:
            check = self._next()
            if check is None:
                break
            queue = self._waiting[check.address]
            del queue[check.who]
            self.waiting -= 1
            if not queue:
                del self._waiting[check.address]
            self._running[check.who] = check
            self._running_by_address[check.address] += 1
            self._running_by_user[check.user] += 1
            self._last_start[check.address] = next(self._clock)
            started.append(check.who)
        return started

    def _next(self) -> _Check[T] | None:
        limits = self.limits
        best: _Check[T] | None = None
        best_turn = 0
        for address, queue in self._waiting.items():
            turn = self._last_start[address]
            if best is not None and turn >= best_turn:
                continue
            if self._running_by_address[address] >= limits.per_address:
                continue
            for check in queue.values():
                if self._running_by_user[check.user] < limits.per_user:
                    best, best_turn = check, turn
                    break
        return best

    def _forget(self, address: str) -> None:
        del self._waiting[address]
        if not self._running_by_address[address]:
            self._last_start.pop(address, None)
