"""Subjects and wildcard patterns: the trie against a plain reference matcher, validation, and the
linear bound (the pattern that froze the old recursive matcher)."""

from __future__ import annotations

import time
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.subjects import MAX_TOKENS, InvalidSubject, SubjectTrie, matches, validate


def reference(pattern: str, subject: str) -> bool:
    """The obvious recursive definition (memoised, so that the test itself stays fast)."""
    pat, words = pattern.split("."), subject.split(".")
    if words[0].startswith("$") and pat[0] in ("*", "#", ">"):
        return False  # reserved subjects: matched by name only

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(words)
        if pat[i] == "#":
            return any(match(i + 1, k) for k in range(j, len(words) + 1))
        if pat[i] == ">":
            return i == len(pat) - 1 and j < len(words)
        if j == len(words):
            return False
        return pat[i] in ("*", words[j]) and match(i + 1, j + 1)

    return match(0, 0)


WORDS = st.sampled_from(["a", "b", "c", "$g"])
PATTERN_TOKENS = st.sampled_from(["a", "b", "c", "$g", "*", "#"])
# '>' only ends a pattern.
PATTERNS = st.tuples(st.lists(PATTERN_TOKENS, min_size=1, max_size=6), st.sampled_from(["", "", ".>"])).map(
    lambda p: ".".join(p[0]) + p[1]
)


@given(st.lists(PATTERNS, min_size=1, max_size=8), st.lists(WORDS, min_size=1, max_size=8))
def test_the_trie_matches_what_the_definition_says(texts: list[str], words: list[str]) -> None:
    trie: SubjectTrie[int] = SubjectTrie()
    for i, text in enumerate(texts):
        trie.insert(text, i)
    subject = ".".join(words)
    assert trie.match(subject) == {i for i, text in enumerate(texts) if reference(text, subject)}


@given(st.lists(PATTERNS, min_size=1, max_size=8), st.data())
def test_removing_patterns_leaves_the_others(texts: list[str], data: st.DataObject) -> None:
    trie: SubjectTrie[int] = SubjectTrie()
    for i, text in enumerate(texts):
        trie.insert(text, i)
    gone = data.draw(st.sets(st.integers(0, len(texts) - 1)))
    for i in gone:
        assert trie.remove(texts[i], i)
        assert not trie.remove(texts[i], i)
    subject = ".".join(data.draw(st.lists(WORDS, min_size=1, max_size=6)))
    kept = {i for i, text in enumerate(texts) if i not in gone and reference(text, subject)}
    assert trie.match(subject) == kept
    for i in set(range(len(texts))) - gone:
        trie.remove(texts[i], i)
    assert trie.patterns == 0
    assert not trie._root.children  # pruned back to nothing


def test_synap_wildcards() -> None:
    assert matches("alerts.*", "alerts.cpu")
    assert not matches("alerts.*", "alerts.cpu.core1")
    assert matches("alerts.#", "alerts.cpu.core1")
    assert matches("alerts.#", "alerts")  # '#' also matches no token
    assert matches("#", "anything.at.all")
    assert not matches("a.b", "a.b.c")


def test_nats_wildcards() -> None:
    assert matches("orders.>", "orders.eu.created")
    assert matches("orders.>", "orders.eu")
    assert not matches("orders.>", "orders")  # '>' takes at least one token
    assert matches(">", "x")
    assert matches("*.eu.>", "orders.eu.created.v1")


def test_wildcards_do_not_reach_reserved_subjects() -> None:
    for pattern in (">", "#", "*.orders", "#.orders", "*.>"):
        assert not matches(pattern, "$G.orders")
    assert matches("$G.>", "$G.orders")
    assert matches("$G.#", "$G")
    assert matches("a.>", "a.$b")  # only the first token is reserved


def test_many_hashes_against_a_long_subject_take_linear_time() -> None:
    # The recursive matcher took 4.4 s for this and ~3x more per extra '#'.
    trie: SubjectTrie[int] = SubjectTrie()
    trie.insert(".".join(["#"] * 20 + ["z"]), 1)
    subject = ".".join(["w"] * MAX_TOKENS)
    started = time.process_time()
    for _ in range(100):
        assert trie.match(subject) == set()
    assert time.process_time() - started < 1.0  # ~21 live nodes x 32 tokens each time


@pytest.mark.parametrize(
    ("text", "wildcards"),
    [
        ("", False),
        ("a..b", False),
        ("a.b.", False),
        ("a b", False),
        ("a\nb", False),
        ("a\x00b", True),
        ("x" * 1025, False),
        (".".join(["t"] * (MAX_TOKENS + 1)), True),
        ("a.*", False),
        ("a.#", False),
        ("a.>", False),
        ("a.>.b", True),
    ],
)
def test_invalid_subjects_are_refused(text: str, wildcards: bool) -> None:
    with pytest.raises(InvalidSubject):
        validate(text, wildcards=wildcards)


def test_valid_subjects() -> None:
    assert validate("orders.eu-1.created", wildcards=False) == "orders.eu-1.created"
    assert validate("orders.*.#", wildcards=True) == "orders.*.#"
