"""Routes cached per subject (as nats-server's sublist caches matches), and dropped only where an
interest change touches them: the cached subjects are indexed by word and position like patterns in
:class:`~meshplane.core.subjects.PatternIndex`, the other way round, so a changed pattern finds the
subjects it matches with one AND per token, whatever the cache holds."""

from __future__ import annotations

from typing import Generic, TypeVar

from meshplane.core.subjects import (
    MAX_TOKENS,
    ONE,
    RESERVED,
    clear_bit,
    pattern_shape,
    subject_counts,
)

T = TypeVar("T")

BULK = 64  # patterns changed at once beyond which the whole cache is dropped instead


class RouteCache(Generic[T]):
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.changes = 0  # routes dropped so far, by interest changes (a copy of a route is stale after one)
        self.clear()

    def clear(self) -> None:
        self.changes += 1
        self._routes: dict[str, T] = {}
        self._slots: dict[str, int] = {}
        self._subjects: list[str] = []
        self._free: list[int] = []
        self._word: list[dict[str, int]] = [{} for _ in range(MAX_TOKENS)]
        self._length: list[int] = [0] * (MAX_TOKENS + 1)
        self._reserved: list[int] = [0] * MAX_TOKENS  # position -> subjects with a leading '$' token there

    def __len__(self) -> int:
        return len(self._routes)

    def get(self, subject: str) -> T | None:
        return self._routes.get(subject)

    def put(self, subject: str, route: T) -> None:
        if subject in self._routes:
            self._routes[subject] = route
            return
        tokens = subject.split(".")
        if len(tokens) > MAX_TOKENS:
            return
        if len(self._routes) >= self.capacity:
            self._drop(next(iter(self._routes)))  # the oldest
        slot = self._free.pop() if self._free else len(self._subjects)
        if slot == len(self._subjects):
            self._subjects.append(subject)
        self._subjects[slot] = subject
        self._slots[subject] = slot
        self._routes[subject] = route
        bit = 1 << slot
        for position, token in enumerate(tokens):
            words = self._word[position]
            words[token] = words.get(token, 0) | bit
        self._length[len(tokens)] |= bit
        for position, token in enumerate(tokens):  # a subject's leading '$' tokens: by name only
            if not token.startswith(RESERVED):
                break
            self._reserved[position] |= bit

    def _drop(self, subject: str) -> None:
        slot = self._slots.pop(subject)
        del self._routes[subject]
        keep = ~(1 << slot)
        tokens = subject.split(".")
        for position, token in enumerate(tokens):
            clear_bit(self._word[position], token, keep)
        self._length[len(tokens)] &= keep
        for position in range(len(tokens)):
            self._reserved[position] &= keep
        self._free.append(slot)

    def invalidate(self, patterns: set[str] | list[str] | tuple[str, ...]) -> None:
        """Drop the routes of every cached subject one of ``patterns`` matches."""
        self.changes += 1
        if len(patterns) > BULK:
            self.clear()
            return
        for pattern in patterns:
            if pattern in self._routes:  # a literal pattern (or a subject that is its own pattern)
                self._drop(pattern)
            if not self._routes:
                return
            if "*" not in pattern and "#" not in pattern and ">" not in pattern:
                continue  # literal, without a split: done above (a burst of changes is mostly these)
            fixed, tail = pattern_shape(pattern)
            if all(token != ONE for token in fixed) and not tail:
                continue  # literal: done above
            candidates = 0
            for count in subject_counts(len(fixed), tail):
                candidates |= self._length[count]
            for position, token in enumerate(fixed):
                if not candidates:
                    break
                if token != ONE:
                    candidates &= self._word[position].get(token, 0)
                else:  # a wildcard never reaches a subject's leading '$' tokens
                    candidates &= ~self._reserved[position]
            if tail and len(fixed) < MAX_TOKENS:
                candidates &= ~self._reserved[len(fixed)]
            while candidates:
                lowest = candidates & -candidates
                self._drop(self._subjects[lowest.bit_length() - 1])
                candidates &= ~lowest
