"""What a connection may cost a node before it has proven anything (as nats-server bounds it): a cap on
connections not yet authenticated, in all and per source address, a deadline to authenticate, and log
lines about them bounded in size and rate (the counters keep the totals)."""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from typing import Generic, TypeVar

TEXT_IN_LOGS = 200  # characters of a peer's text in a log line or an error, at most
LOG_INTERVAL = 1.0  # seconds between two log lines of one kind about connections not yet proven


T = TypeVar("T")


def bounded(text: str, limit: int = TEXT_IN_LOGS) -> str:
    """A peer-supplied string fit for a log line or an error: its repr, cut to ``limit`` characters."""
    shown = repr(text[:limit])
    return shown if len(text) <= limit else f"{shown}... ({len(text)} characters)"


class QuietLog:
    """One line per kind a second at most; the lines left out are counted into the next one."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def warning(self, kind: str, message: str, *args: object) -> None:
        self.log(logging.WARNING, kind, message, *args)

    def error(self, kind: str, message: str, *args: object) -> None:
        self.log(logging.ERROR, kind, message, *args)

    def log(self, level: int, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval) < self.interval:
            self._quiet[kind] += 1
            return
        self._last[kind] = now
        left_out = self._quiet.pop(kind, 0)
        suffix = f" (and {left_out} more like it)" if left_out else ""
        self.logger.log(level, message + suffix, *args)


class Unproven(Generic[T]):
    """Connections accepted whose handshake is not complete, in all and by source address.

    Past the cap in all, the oldest unproven connection makes room for the newcomer (it had the most
    time to prove itself): holders of slots that never prove anything cannot keep a node's peers out,
    as they could if newcomers were refused. Past the cap of its address, a newcomer is refused."""

    def __init__(self, limit: int, per_address: int) -> None:
        self.limit = limit
        self.per_address = per_address
        self.by_address: Counter[str] = Counter()
        self._pending: OrderedDict[T, str] = OrderedDict()  # oldest first
        self.evicted = 0

    @property
    def count(self) -> int:
        return len(self._pending)

    def admit(self, who: T, address: str) -> tuple[str, T | None]:
        """("", the connection to close to make room, if any) when ``who`` from ``address`` may begin
        its handshake (counted until :meth:`done`), else (the limit it passes, None)."""
        if self.by_address[address] >= self.per_address:
            return "address_limit", None
        oldest = None
        if len(self._pending) >= self.limit:
            oldest, its_address = self._pending.popitem(last=False)
            self._release(its_address)
            self.evicted += 1
        self._pending[who] = address
        self.by_address[address] += 1
        return "", oldest

    def done(self, who: T) -> None:
        address = self._pending.pop(who, None)
        if address is not None:
            self._release(address)

    def _release(self, address: str) -> None:
        if self.by_address[address] > 1:
            self.by_address[address] -= 1
        else:
            del self.by_address[address]
