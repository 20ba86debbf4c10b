"""The remote interest index (literals in a dict, wildcards in a PatternIndex) against the reference it
replaced: one PatternIndex of every pattern. Random inserts, removals and matches give the same answers."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.mesh.remote_index import RemoteIndex, is_literal
from meshplane.core.mesh.router import Router
from meshplane.core.subjects import PatternIndex

WORDS = st.sampled_from(["a", "b", "$G", "x*y", "c>"])
PATTERN_TOKENS = st.one_of(WORDS, st.sampled_from(["*", "*", "a"]))
TAILS = st.sampled_from(["", "", ".>", ".#"])
PATTERNS = st.builds(
    lambda tokens, tail: ".".join(tokens) + tail if tokens else tail[1:] or "a",
    st.lists(PATTERN_TOKENS, min_size=0, max_size=4),
    TAILS,
)
SUBJECTS = st.builds(".".join, st.lists(WORDS, min_size=1, max_size=5))
PEERS = st.sampled_from(["n1", "n2", "n3"])
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), PATTERNS, PEERS),
        st.tuples(st.just("remove"), PATTERNS, PEERS),
        st.tuples(st.just("match"), SUBJECTS, PEERS),
    ),
    max_size=60,
)


@settings(max_examples=400)
@given(STEPS)
def test_the_index_answers_as_one_pattern_index(steps: list[tuple[str, str, str]]) -> None:
    index, reference = RemoteIndex(), PatternIndex[str]()
    held: list[tuple[str, str]] = []
    for op, text, peer in steps:
        if op == "insert":
            assert index.insert(text, peer) == reference.insert(text, peer)
            held.append((text, peer))
        elif op == "remove":
            assert index.remove(text, peer) == reference.remove(text, peer)
        else:
            assert index.match(text) == reference.match(text)
        assert index.patterns == reference.patterns
    for text, peer in held:  # everything taken away: nothing left to match
        index.remove(text, peer)
    assert index.patterns == 0
    assert index.match("a") == set()


def test_a_star_or_angle_inside_a_word_is_literal() -> None:
    assert is_literal("orders.x*y.c>")
    assert not is_literal("orders.*")
    assert not is_literal("orders.>")
    assert not is_literal("#")


def test_a_peer_s_literal_change_costs_no_copy_of_its_other_patterns() -> None:
    """The reason for the index: with 100,000 literal patterns of a peer held, one more added and
    removed allocates a few hundred bytes, not integers as long as the patterns held (12.5 kB each,
    several per change, in the bit-set index every change went through before)."""
    router: Router[str] = Router()
    router.add_peer("n1")
    for i in range(100_000):
        router.apply("n1", f"churn.old.{i}", i + 1, added=True)
    tracemalloc.start()
    try:
        router.apply("n1", "churn.new.0", 100_001, added=True)
        router.apply("n1", "churn.new.0", 100_002, added=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4096, f"one change allocated {peak} bytes at its peak"
    assert router.route("churn.old.99999").peers == ("n1",)
    assert router.route("churn.new.0").peers == ()
