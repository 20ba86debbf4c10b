"""Which peers want a subject: the remote half of the routing table, sans I/O.

Literal patterns (most of what clients hold) sit in a dict, pattern -> peers, so adding or removing
one costs O(1) whatever else is held; only wildcard patterns go to a
:class:`~meshplane.core.subjects.PatternIndex`, whose bit sets are as long as the patterns it holds
(with every pattern there, each change of interest copied integers of as many bits: 100,000
subscriptions churning made a peer's changes cost milliseconds each). A literal pattern is its own
subject, so matching looks the subject up once, then asks the wildcard index.
"""

from __future__ import annotations

from meshplane.core.subjects import WILDCARDS, PatternIndex


def is_literal(pattern: str) -> bool:
    if "*" not in pattern and "#" not in pattern and ">" not in pattern:
        return True  # the common case, without a split
    return not any(token in WILDCARDS for token in pattern.split("."))


class RemoteIndex:
    def __init__(self) -> None:
        self._literal: dict[str, set[str]] = {}
        self._wildcard: PatternIndex[str] = PatternIndex()

    def insert(self, pattern: str, peer: str) -> bool:
        """``peer`` wants ``pattern``; False if it was there already."""
        if not is_literal(pattern):
            return self._wildcard.insert(pattern, peer)
        peers = self._literal.setdefault(pattern, set())
        if peer in peers:
            return False
        peers.add(peer)
        return True

    def remove(self, pattern: str, peer: str) -> bool:
        """``peer`` wants ``pattern`` no more; False if it did not."""
        if not is_literal(pattern):
            return self._wildcard.remove(pattern, peer)
        peers = self._literal.get(pattern)
        if peers is None or peer not in peers:
            return False
        peers.discard(peer)
        if not peers:
            del self._literal[pattern]
        return True

    @property
    def patterns(self) -> int:
        return len(self._literal) + self._wildcard.patterns

    def match(self, subject: str) -> set[str]:
        """The peers of every pattern that matches ``subject``."""
        found = set(self._literal.get(subject, ()))
        if self._wildcard.patterns:
            found |= self._wildcard.match(subject)
        return found
