"""Dot-separated subjects and wildcard subscriptions, matched in linear time.

A subject is tokens separated by dots (``orders.eu.created``). A pattern may use whole-token
wildcards: ``*`` matches exactly one token, ``#`` any number of tokens, zero included (Synap's and
AMQP's rules), and ``>`` as its last token one or more tokens (NATS's and Solace's rule).
Patterns live in a token trie (as nats-server's sublist keeps them); matching walks it
with a set of live nodes, so one subject costs O(tokens x trie nodes) at worst, never the exponential
backtracking of a recursive matcher (``#.#.#.#.z`` against a long subject).

Subjects whose first token starts with ``$`` are reserved (MQTT's rule): a wildcard in the first
token does not match them, only a pattern that names that token does (the mesh keeps its guaranteed
interest under ``$G``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
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
    if not subject.isprintable() or any(c.isspace() for c in subject):
        raise InvalidSubject(f"{what} {subject[:80]!r} holds a space or a control character")
    tokens = subject.split(".")
    if len(tokens) > MAX_TOKENS:
        raise InvalidSubject(f"{what} has {len(tokens)} tokens; at most {MAX_TOKENS}")
    if "" in tokens:
        raise InvalidSubject(f"{what} {subject[:80]!r} has an empty token")
    if not wildcards and any(w in tokens for w in WILDCARDS):
        raise InvalidSubject(f"subject {subject[:80]!r} holds a wildcard: only patterns may")
    if REST in tokens[:-1]:
        raise InvalidSubject(f"pattern {subject[:80]!r}: '>' may only be the last token")
    return subject


@dataclass(eq=False, slots=True)
class _Node(Generic[V]):
    children: dict[str, _Node[V]] = field(default_factory=dict)
    values: set[V] = field(default_factory=set)
    takes_any: bool = False  # a '#' or '>' node: it may take any number of further tokens


class SubjectTrie(Generic[V]):
    """Patterns, each with the values (subscribers) that hold it."""

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self.patterns = 0

    def insert(self, pattern: str, value: V) -> bool:
        """Add ``value`` under ``pattern``; False if it was there already."""
        node = self._root
        for token in pattern.split("."):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(takes_any=token in (ANY, REST))
            node = child
        if value in node.values:
            return False
        if not node.values:
            self.patterns += 1
        node.values.add(value)
        return True

    def remove(self, pattern: str, value: V) -> bool:
        """Take ``value`` off ``pattern`` (pruning empty branches); False if it was not there."""
        path: list[tuple[_Node[V], str]] = []
        node = self._root
        for token in pattern.split("."):
            child = node.children.get(token)
            if child is None:
                return False
            path.append((node, token))
            node = child
        if value not in node.values:
            return False
        node.values.discard(value)
        if not node.values:
            self.patterns -= 1
        for parent, token in reversed(path):
            child = parent.children[token]
            if child.values or child.children:
                break
            del parent.children[token]
        return True

    def match(self, subject: str) -> set[V]:
        """The values of every pattern that matches ``subject``."""
        tokens = subject.split(".")
        if is_reserved(subject):
            first = self._root.children.get(tokens.pop(0))
            if first is None:
                return set()
            live = self._closure([first])
        else:
            live = self._closure([self._root])
        for token in tokens:
            following: list[_Node[V]] = []
            for node in live:
                children = node.children
                following.extend(
                    child
                    for child in (children.get(token), children.get(ONE), children.get(REST))
                    if child is not None
                )
                if node.takes_any:
                    following.append(node)
            if not following:
                return set()
            live = self._closure(following)
        found: set[V] = set()
        for node in live:
            found |= node.values
        return found

    @staticmethod
    def _closure(nodes: Iterable[_Node[V]]) -> list[_Node[V]]:
        """The distinct nodes, and the '#' nodes reachable from them by matching zero tokens ('>' needs
        one token, so it is reached only by matching)."""
        out: list[_Node[V]] = []
        seen: set[int] = set()
        stack = list(nodes)
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            out.append(node)
            any_child = node.children.get(ANY)
            if any_child is not None:
                stack.append(any_child)
        return out


def matches(pattern: str, subject: str) -> bool:
    """Whether one pattern matches one subject (the trie with one entry)."""
    trie: SubjectTrie[int] = SubjectTrie()
    trie.insert(pattern, 0)
    return bool(trie.match(subject))
