"""Dot-separated subjects and wildcard subscriptions, matched at a bounded cost.

A subject is tokens separated by dots (``orders.eu.created``). A pattern may use whole-token
wildcards: ``*`` matches exactly one token; as its last token only, ``#`` any number of tokens, zero
included (Synap's, and MQTT's rule for where it may stand), and ``>`` one or more (NATS's and
Solace's). With the multi-token wildcards at the end, every pattern is a fixed sequence of words and
``*``: :class:`PatternIndex` matches a subject with one bit-set AND per token, whatever patterns are
held (a ``#`` in the middle made some sets of patterns cost seconds per subject in a token trie).

Subjects whose first token starts with ``$`` are reserved (MQTT's rule): a wildcard in the first
token does not match them, only a pattern that names that token does (the mesh keeps its guaranteed
interest under ``$G``). The rule holds for each of a subject's leading ``$`` tokens: in
``$G.$vpn:A.orders`` both are matched by name only, so ``$G.>`` (a default VPN's queue on ``>``) does
not reach a VPN's guaranteed events (:mod:`meshplane.core.mesh.vpn`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

ONE = "*"
ANY = "#"
REST = ">"
WILDCARDS = (ONE, ANY, REST)
RESERVED = "$"  # a first token starting with it is matched by name only
MAX_SUBJECT_BYTES = 1024
MAX_TOKENS = 32

V = TypeVar("V", bound=Hashable)


class InvalidSubject(ValueError):
    """A subject or pattern that breaks the rules (empty token, control character, too long...)."""


def is_reserved(subject: str) -> bool:
    """Whether a subject or pattern is reserved (its first token starts with ``$``)."""
    return subject.startswith(RESERVED)


def validate(subject: object, *, wildcards: bool) -> str:
    """``subject`` if it is a valid subject (``wildcards=False``) or pattern; else InvalidSubject."""
    what = "pattern" if wildcards else "subject"
    if not isinstance(subject, str) or not subject:
        raise InvalidSubject(f"a {what} must be a non-empty string, not {subject!r}")
    size = len(subject.encode("utf-8", "surrogatepass"))
    if size > MAX_SUBJECT_BYTES:
        raise InvalidSubject(f"{what} of {size} bytes is longer than {MAX_SUBJECT_BYTES}")
    # Every Unicode space but ' ' is unprintable: the two checks cover all whitespace.
    if not subject.isprintable() or " " in subject:
        raise InvalidSubject(f"{what} {subject[:80]!r} holds a space or a control character")
    tokens = subject.split(".")
    if len(tokens) > MAX_TOKENS:
        raise InvalidSubject(f"{what} has {len(tokens)} tokens; at most {MAX_TOKENS}")
    if "" in tokens:
        raise InvalidSubject(f"{what} {subject[:80]!r} has an empty token")
    if not wildcards and any(w in tokens for w in WILDCARDS):
        raise InvalidSubject(f"subject {subject[:80]!r} holds a wildcard: only patterns may")
    if REST in tokens[:-1] or ANY in tokens[:-1]:
        raise InvalidSubject(f"pattern {subject[:80]!r}: '#' and '>' may only be the last token")
    return subject


def fits(subject: str) -> bool:
    """Whether a subject or pattern as the mesh carries it (a VPN's prefix, ``$mqtt.``, ``$NQ.G.`` in
    front) is within MAX_SUBJECT_BYTES and MAX_TOKENS: a client's subject is checked without what goes
    in front, and peers take no more (a frame's subject past the bytes breaks the link it is on)."""
    return (
        subject.count(".") < MAX_TOKENS and len(subject.encode("utf-8", "surrogatepass")) <= MAX_SUBJECT_BYTES
    )


def valid_pattern(text: str) -> str | None:
    """``text`` when it is a valid pattern, else None (for input that is counted, not raised)."""
    try:
        return validate(text, wildcards=True)
    except InvalidSubject:
        return None


class SubjectCheck:
    """Whether a subject is valid (and, unless ``reserved``, not reserved), each subject checked once:
    subjects repeat. Bounded: emptied when ``capacity`` subjects are known."""

    def __init__(self, capacity: int = 4096, *, reserved: bool = True) -> None:
        self.capacity = capacity
        self.reserved = reserved
        self._known: dict[str, bool] = {}

    def __call__(self, subject: str) -> bool:
        known = self._known.get(subject)
        if known is None:
            if len(self._known) >= self.capacity:
                self._known.clear()
            try:
                known = bool(validate(subject, wildcards=False)) and (
                    self.reserved or not is_reserved(subject)
                )
            except InvalidSubject:
                known = False
            self._known[subject] = known
        return known


class PatternIndex(Generic[V]):
    """Patterns, each with the values (subscribers) that hold it, matched with bit sets.

    Every pattern has a slot (a bit). Per token position the index keeps which patterns name each
    word there, which have ``*`` there, and which end before it with ``#`` or ``>`` (so take any word
    there); per subject length, which patterns can match that many tokens. Matching a subject is one
    AND per token over those bit sets (each as long as the number of patterns, a Python int), then one
    step per value found: the patterns a found value holds alone are cleared at once, so a subscriber
    holding 10,000 patterns that all match costs one step, not 10,000. A pattern others hold too is
    still looked at (its other holders are not found yet), once.
    """

    def __init__(self) -> None:
        self._slots: dict[str, int] = {}  # pattern -> its bit's index
        self._values: list[set[V]] = []  # slot -> the values holding that pattern
        self._free: list[int] = []
        self._word: list[dict[str, int]] = [{} for _ in range(MAX_TOKENS)]  # position -> word -> bits
        self._one: list[int] = [0] * MAX_TOKENS  # position -> patterns with '*' there
        self._open: list[int] = [0] * MAX_TOKENS  # position -> patterns ended by '#'/'>' before it
        self._length: list[int] = [0] * (MAX_TOKENS + 1)  # token count -> patterns that can match it
        self._alone: dict[V, int] = {}  # value -> the bits of the patterns only it holds
        self.patterns = 0

    def insert(self, pattern: str, value: V) -> bool:
        """Add ``value`` under ``pattern``; False if it was there already."""
        slot = self._slots.get(pattern)
        if slot is None:
            slot = self._add(pattern)
        holders = self._values[slot]
        if value in holders:
            return False
        if len(holders) == 1:
            self._set_alone(next(iter(holders)), slot, False)
        holders.add(value)
        if len(holders) == 1:
            self._set_alone(value, slot, True)
        return True

    def _set_alone(self, value: V, slot: int, alone: bool) -> None:
        bits = self._alone.get(value, 0)
        bits = bits | (1 << slot) if alone else bits & ~(1 << slot)
        if bits:
            self._alone[value] = bits
        else:
            self._alone.pop(value, None)

    def _add(self, pattern: str) -> int:
        fixed, tail = pattern_shape(pattern)
        slot = self._free.pop() if self._free else len(self._values)
        if slot == len(self._values):
            self._values.append(set())
        bit = 1 << slot
        self._slots[pattern] = slot
        for position, token in enumerate(fixed):
            if token == ONE:
                self._one[position] |= bit
            else:
                words = self._word[position]
                words[token] = words.get(token, 0) | bit
        for position in range(len(fixed), MAX_TOKENS) if tail else ():
            self._open[position] |= bit
        for count in subject_counts(len(fixed), tail):
            self._length[count] |= bit
        self.patterns += 1
        return slot

    def remove(self, pattern: str, value: V) -> bool:
        """Take ``value`` off ``pattern``; False if it was not there."""
        slot = self._slots.get(pattern)
        if slot is None or value not in self._values[slot]:
            return False
        holders = self._values[slot]
        holders.discard(value)
        self._set_alone(value, slot, False)
        if len(holders) == 1:
            self._set_alone(next(iter(holders)), slot, True)
        if not holders:
            self._drop(pattern, slot)
        return True

    def _drop(self, pattern: str, slot: int) -> None:
        fixed, tail = pattern_shape(pattern)
        keep = ~(1 << slot)
        for position, token in enumerate(fixed):
            if token == ONE:
                self._one[position] &= keep
            else:
                clear_bit(self._word[position], token, keep)
        for position in range(len(fixed), MAX_TOKENS) if tail else ():
            self._open[position] &= keep
        for count in subject_counts(len(fixed), tail):
            self._length[count] &= keep
        del self._slots[pattern]
        self._free.append(slot)
        self.patterns -= 1

    def match(self, subject: str) -> set[V]:
        """The values of every pattern that matches ``subject`` (of at most MAX_TOKENS tokens)."""
        tokens = subject.split(".")
        if len(tokens) > MAX_TOKENS:
            return set()
        candidates = self._length[len(tokens)]
        position = 0
        # The leading reserved tokens by name only: no wildcard there (a VPN's prefix, $G's).
        while candidates and position < len(tokens) and tokens[position].startswith(RESERVED):
            candidates &= self._word[position].get(tokens[position], 0)
            position += 1
        words, one, open_ = self._word, self._one, self._open
        while candidates and position < len(tokens):
            candidates &= words[position].get(tokens[position], 0) | one[position] | open_[position]
            position += 1
        found: set[V] = set()
        while candidates:
            lowest = candidates & -candidates
            for value in self._values[lowest.bit_length() - 1]:
                if value not in found:
                    found.add(value)
                    candidates &= ~self._alone.get(value, 0)  # the patterns it holds alone need no look
            candidates &= ~lowest
        return found


def clear_bit(postings: dict[str, int], word: str, keep: int) -> None:
    """``postings[word] &= keep``, the word dropped once no bit is left."""
    left = postings[word] & keep
    if left:
        postings[word] = left
    else:
        del postings[word]


def pattern_shape(pattern: str) -> tuple[list[str], str]:
    """A pattern's fixed tokens and its tail wildcard ('#', '>' or '')."""
    tokens = pattern.split(".")
    if len(tokens) > MAX_TOKENS:
        raise InvalidSubject(f"pattern has {len(tokens)} tokens; at most {MAX_TOKENS}")
    tail = tokens[-1] if tokens[-1] in (ANY, REST) else ""
    fixed = tokens[:-1] if tail else tokens
    if ANY in fixed or REST in fixed:
        raise InvalidSubject(f"pattern {pattern[:80]!r}: '#' and '>' may only be the last token")
    return fixed, tail


def subject_counts(fixed: int, tail: str) -> range:
    """The token counts of the subjects a pattern of ``fixed`` tokens and ``tail`` can match."""
    if tail == ANY:
        return range(fixed, MAX_TOKENS + 1)
    if tail == REST:
        return range(fixed + 1, MAX_TOKENS + 1)
    return range(fixed, fixed + 1)


def matches(pattern: str, subject: str) -> bool:
    """Whether one pattern matches one subject (the trie with one entry)."""
    index: PatternIndex[int] = PatternIndex()
    index.insert(pattern, 0)
    return bool(index.match(subject))
