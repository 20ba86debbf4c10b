"""One NATS connection's subscriptions, sans I/O: sids to subjects, ``UNSUB max``, and which patterns
the connection holds on its node (a pattern is held while any of its sids wants it)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from meshplane.core.subjects import PatternIndex

MATCHES_CACHED = 1024


class SubscriptionLimit(ValueError):
    """More subscriptions than one connection may hold."""


@dataclass(slots=True)
class Subscription:
    sid: str
    pattern: str  # as the node holds it: the VPN's prefix, then the NATS subject
    queue: str
    max_msgs: int | None = None  # UNSUB sid max: delivered ones count toward it
    delivered: int = 0


class Subscriptions:
    """``add``/``remove`` answer whether the node must subscribe/unsubscribe the pattern."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.by_sid: dict[str, Subscription] = {}
        self._index: PatternIndex[str] = PatternIndex()
        self._patterns: Counter[str] = Counter()
        self._matches: dict[str, list[Subscription]] = {}  # subject -> its subscriptions (subjects repeat)

    def __len__(self) -> int:
        return len(self.by_sid)

    def add(self, sid: str, pattern: str, queue: str = "") -> bool:
        """A new sid (:meth:`remove` a sid taken before); True when ``pattern`` is new here."""
        if sid in self.by_sid:
            raise ValueError(f"sid {sid[:40]!r} is taken")
        if len(self.by_sid) >= self.limit:
            raise SubscriptionLimit(f"{self.limit} subscriptions on one connection")
        fresh_pattern = pattern not in self._patterns
        self._matches.clear()
        self.by_sid[sid] = Subscription(sid, pattern, queue)
        self._index.insert(pattern, sid)
        self._patterns[pattern] += 1
        return fresh_pattern

    def remove(self, sid: str) -> str | None:
        """Drop ``sid``; the pattern the node must unsubscribe (none of its sids left), else None."""
        sub = self.by_sid.pop(sid, None)
        if sub is None:
            return None
        self._matches.clear()
        self._index.remove(sub.pattern, sid)
        self._patterns[sub.pattern] -= 1
        if self._patterns[sub.pattern] == 0:
            del self._patterns[sub.pattern]
            return sub.pattern
        return None

    def unsub(self, sid: str, max_msgs: int | None) -> str | None:
        """UNSUB: at once, or once ``max_msgs`` were delivered in all (at once when they were already)."""
        sub = self.by_sid.get(sid)
        if sub is None:
            return None
        if max_msgs is not None and sub.delivered < max_msgs:
            sub.max_msgs = max_msgs
            return None
        return self.remove(sid)

    def matching(self, subject: str) -> list[Subscription]:
        """The subscriptions an event on ``subject`` goes to (each counted as delivered)."""
        subs = self.matches(subject)
        for sub in subs:
            sub.delivered += 1
        return subs

    def matches(self, subject: str) -> list[Subscription]:
        """The subscriptions an event on ``subject`` would go to (none counted)."""
        subs = self._matches.get(subject)
        if subs is None:
            if len(self._matches) >= MATCHES_CACHED:
                self._matches.clear()
            subs = self._matches[subject] = [self.by_sid[sid] for sid in sorted(self._index.match(subject))]
        return subs

    def expired(self, sub: Subscription) -> str | None:
        """After a delivery: removed when it reached its max (then as :meth:`remove`), else None."""
        if sub.max_msgs is not None and sub.delivered >= sub.max_msgs:
            return self.remove(sub.sid)
        return None

    def patterns(self) -> list[str]:
        return list(self._patterns)
