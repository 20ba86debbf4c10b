"""Bloom filters over interest patterns: a fast "no" before the exact (trie) lookup.

A filter holds subjects, not patterns, so a pattern goes in as a key its matching subjects can find:
a literal pattern as ``=subject``, a wildcard pattern as ``^`` plus its tokens before the first
wildcard. A subject probes ``=subject`` and ``^`` plus each of its prefixes (the empty one too):
one probe per token, and a pattern that matches a subject is always found (no false negatives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from meshplane.core.subjects import WILDCARDS

_MASK = (1 << 64) - 1


def pattern_key(pattern: str) -> str:
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        if token in WILDCARDS:
            return "^" + ".".join(tokens[:i])
    return "=" + pattern


def subject_keys(subject: str) -> list[str]:
    tokens = subject.split(".")
    return ["=" + subject] + ["^" + ".".join(tokens[:i]) for i in range(len(tokens) + 1)]


@dataclass(frozen=True)
class BloomShape:
    """Bits and hash count for ``capacity`` keys at false-positive rate ``fpr`` (the usual formulas)."""

    capacity: int
    fpr: float

    def __post_init__(self) -> None:
        if self.capacity < 1 or not 0 < self.fpr < 1:
            raise ValueError("bloom_filter_capacity must be >= 1 and bloom_filter_fpr in (0, 1)")

    @cached_property
    def bits(self) -> int:
        return max(8, math.ceil(-self.capacity * math.log(self.fpr) / math.log(2) ** 2))

    @cached_property
    def hashes(self) -> int:
        return max(1, round(self.bits / self.capacity * math.log(2)))

    def positions(self, key: str) -> tuple[int, ...]:
        # Python's str hash: keyed per process (a peer cannot choose keys that collide here), cached
        # in the str, and far cheaper than a digest; the filter never leaves the process.
        h1 = hash(key) & _MASK
        h2 = hash("\x00" + key) | 1
        bits = self.bits
        return tuple([(h1 + i * h2) % bits for i in range(self.hashes)])


class BloomFilter:
    def __init__(self, shape: BloomShape) -> None:
        self.shape = shape
        self._bits = bytearray((shape.bits + 7) // 8)
        self.keys = 0

    def add(self, positions: tuple[int, ...]) -> None:
        for p in positions:
            self._bits[p >> 3] |= 1 << (p & 7)
        self.keys += 1

    def may_contain(self, positions: tuple[int, ...]) -> bool:
        bits = self._bits
        return all(bits[p >> 3] & (1 << (p & 7)) for p in positions)

    def clear(self) -> None:
        self._bits = bytearray(len(self._bits))
        self.keys = 0
