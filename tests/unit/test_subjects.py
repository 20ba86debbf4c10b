"""Subjects and wildcard patterns: the trie against a plain reference matcher, validation, and the
linear bound (the pattern that froze the old recursive matcher)."""

from __future__ import annotations

import random
import time
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.subjects import (
    MAX_TOKENS,
    InvalidSubject,
    PatternIndex,
    SubjectCheck,
    matches,
    valid_pattern,
    validate,
)
from tests.support.subjects import PATTERNS, WORDS


def reference(pattern: str, subject: str) -> bool:
    """The obvious recursive definition (memoised, so that the test itself stays fast)."""
    pat, words = pattern.split("."), subject.split(".")
    # A subject's leading '$' tokens (reserved: $G, a VPN's prefix) are matched by name only.
    lead = next((n for n, word in enumerate(words) if not word.startswith("$")), len(words))

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(words)
        if pat[i] == "#":
            return match(i + 1, j) or (
                j >= lead and any(match(i + 1, k) for k in range(j + 1, len(words) + 1))
            )
        if pat[i] == ">":
            return i == len(pat) - 1 and lead <= j < len(words)
        if j == len(words):
            return False
        return (pat[i] == words[j] or (pat[i] == "*" and j >= lead)) and match(i + 1, j + 1)

    return match(0, 0)


@given(st.lists(PATTERNS, min_size=1, max_size=8), st.lists(WORDS, min_size=1, max_size=8))
def test_the_trie_matches_what_the_definition_says(texts: list[str], words: list[str]) -> None:
    trie: PatternIndex[int] = PatternIndex()
    for i, text in enumerate(texts):
        trie.insert(text, i)
    subject = ".".join(words)
    assert trie.match(subject) == {i for i, text in enumerate(texts) if reference(text, subject)}


@given(st.lists(PATTERNS, min_size=1, max_size=8), st.data())
def test_removing_patterns_leaves_the_others(texts: list[str], data: st.DataObject) -> None:
    trie: PatternIndex[int] = PatternIndex()
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
    assert not trie._slots  # nothing left behind
    assert not any(trie._word)
    assert not any(trie._one)
    assert not any(trie._length)


SHARED_PATTERNS = st.sampled_from(["t.*", "t.>", "t.x", "*.x", ">", "t.#", "#", "*", "t", "x.>"])


@given(
    st.lists(st.tuples(st.sampled_from("abc"), SHARED_PATTERNS), min_size=1, max_size=12),
    st.data(),
)
def test_values_sharing_patterns_are_each_found(held: list[tuple[str, str]], data: st.DataObject) -> None:
    """Several subscribers, each with several patterns, some the same: a found subscriber's patterns
    may be skipped only where nobody else holds them."""
    index: PatternIndex[str] = PatternIndex()
    for value, text in held:
        index.insert(text, value)
    gone = data.draw(st.sets(st.sampled_from(held)))
    for value, text in gone:
        index.remove(text, value)
    kept = set(held) - gone
    subject = ".".join(data.draw(st.lists(st.sampled_from(["t", "x"]), min_size=1, max_size=3)))
    assert index.match(subject) == {value for value, text in kept if reference(text, subject)}


def test_a_pattern_held_by_a_found_subscriber_still_finds_its_other_holders() -> None:
    index: PatternIndex[str] = PatternIndex()
    index.insert("t.*", "c")
    index.insert("t.>", "b")
    index.insert("t.>", "c")  # was: c found through t.*, then t.> skipped as c's, and b never found
    assert index.match("t.x") == {"b", "c"}


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
    for pattern in (">", "#", "*.orders", "*.#", "*.>"):
        assert not matches(pattern, "$G.orders")
    assert matches("$G.>", "$G.orders")
    assert matches("$G.#", "$G")
    assert matches("a.>", "a.$b")  # only leading '$' tokens are reserved
    for pattern in ("$G.>", "$G.#", "$G.*.orders", "$G.*.>"):  # a VPN's prefix after $G: by name only
        assert not matches(pattern, "$G.$vpn:A.orders")
    assert matches("$G.$vpn:A.>", "$G.$vpn:A.orders")
    assert matches("$vpn:A.*", "$vpn:A.orders")
    assert not matches("*.orders", "$vpn:A.orders")


def test_ten_thousand_adversarial_patterns_cost_little_per_subject() -> None:
    # One subscriber's patterns of '*' and one word, all of the longest length: in a token trie every
    # one of the ~100,000 nodes was live for a subject of that word (seconds per new subject).
    rng = random.Random(7)
    index: PatternIndex[str] = PatternIndex()
    while index.patterns < 10_000:
        index.insert(".".join(rng.choice(("*", "w")) for _ in range(MAX_TOKENS - 1)) + ".z", "mallory")
    index.insert("w.>", "honest")
    subjects = [".".join(["w"] * (MAX_TOKENS - 1) + [f"z{i}" if i % 2 else "z"]) for i in range(200)]
    started = time.process_time()
    for subject in subjects:
        index.match(subject)
    assert (time.process_time() - started) / len(subjects) < 0.005  # ~0.1 ms here; the trie took ~1 s
    assert index.match(subjects[0]) == {"mallory", "honest"}
    assert index.match(subjects[1]) == {"honest"}


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
        ("a.#.b", True),
        ("#.#.z", True),
    ],
)
def test_invalid_subjects_are_refused(text: str, wildcards: bool) -> None:
    with pytest.raises(InvalidSubject):
        validate(text, wildcards=wildcards)


def test_valid_subjects() -> None:
    assert validate("orders.eu-1.created", wildcards=False) == "orders.eu-1.created"
    assert validate("orders.*.#", wildcards=True) == "orders.*.#"


def test_subject_check_answers_as_validate_and_stays_bounded() -> None:
    check = SubjectCheck(capacity=3)
    assert check("a.b")
    assert not check("a.*")
    assert not check("a..b")
    for n in range(10):
        assert check(f"s.{n}")
        assert len(check._known) <= 3
    assert valid_pattern("a.*.>") == "a.*.>"
    assert valid_pattern("a.>.b") is None


def test_what_fits_is_what_a_peer_takes_with_the_prefix_in() -> None:
    """A client's subject is valid without the prefix the mesh puts in front of it; with it, it must
    still be a subject a peer's reader and interest take (1,024 bytes, 32 tokens)."""
    from meshplane.core.subjects import MAX_SUBJECT_BYTES, MAX_TOKENS, fits

    longest = "x" * (MAX_SUBJECT_BYTES - 7)
    assert fits("$vpn:B." + longest)
    assert not fits("$vpn:B.x" + longest)
    assert fits(".".join(["t"] * MAX_TOKENS))
    assert not fits("$vpn:B." + ".".join(["t"] * MAX_TOKENS))
    assert not fits("é" * (MAX_SUBJECT_BYTES // 2 + 1))  # bytes, not characters
