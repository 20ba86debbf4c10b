"""What a connection may cost a node before it has proven anything (as nats-server bounds it): a cap on
connections not yet authenticated, in all and per source address, a deadline to authenticate, and log
lines about them bounded in size and rate (the counters keep the totals)."""

from __future__ import annotations

import logging
import time
from collections import Counter

TEXT_IN_LOGS = 200  # characters of a peer's text in a log line or an error, at most
LOG_INTERVAL = 1.0  # seconds between two log lines of one kind about connections not yet proven


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
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval) < self.interval:
            self._quiet[kind] += 1
            return
        self._last[kind] = now
        left_out = self._quiet.pop(kind, 0)
        suffix = f" (and {left_out} more like it)" if left_out else ""
        self.logger.warning(message + suffix, *args)


class Unproven:
    """Connections accepted whose handshake is not complete, in all and by source address."""

    def __init__(self, limit: int, per_address: int) -> None:
        self.limit = limit
        self.per_address = per_address
        self.by_address: Counter[str] = Counter()
        self.count = 0

    def admit(self, address: str) -> str:
        """ "" when a connection from ``address`` may begin its handshake (it is then counted until
        :meth:`done`), else the limit it passes."""
        if self.count >= self.limit:
            return "unauthenticated_limit"
        if self.by_address[address] >= self.per_address:
            return "address_limit"
        self.count += 1
        self.by_address[address] += 1
        return ""

    def done(self, address: str) -> None:
        self.count -= 1
        if self.by_address[address] > 1:
            self.by_address[address] -= 1
        else:
            del self.by_address[address]
