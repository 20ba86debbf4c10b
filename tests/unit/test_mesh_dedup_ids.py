"""The dedup ids in C (``DedupIds``, ``core/mesh/dedup_ids.h``) against the reference ``PyIds`` (an
OrderedDict): the same answers, order, stamps and bound after any sequence of checks and expiries, and a
``DedupCache`` on either kind the same duplicates, forgotten topics and contents."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.mesh._frames import DedupIds
from meshplane.core.mesh.dedup import DEFAULT_IDS, MAX_PER_TOPIC, DedupCache, EventId, PyIds
from meshplane.errors import ConfigError

KEYS = st.tuples(
    st.sampled_from([0, 1, 2, 2**64 - 1]),
    st.integers(0, 5),
    st.sampled_from(["a", "node-b", "é", None]),
    st.sampled_from(["p", "q", None]),
)
# a check of an id at a time, or an expiry of what was seen at a cutoff or before
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("seen"), KEYS, st.integers(0, 20)),
        st.tuples(st.just("expire"), st.none(), st.integers(-1, 21)),
    ),
    max_size=120,
)


def test_the_cache_uses_the_c_ids() -> None:
    assert DEFAULT_IDS is DedupIds, "the C extension was not built"


@settings(max_examples=500)
@given(OPS, st.sampled_from([0, 1, 2, 3, 7, 8, 9, 17, 100]))
def test_c_and_python_ids_agree(ops: list[tuple[str, EventId | None, int]], bound: int) -> None:
    reference, compiled = PyIds(bound), DedupIds(bound)
    for op, key, when in ops:
        if op == "seen":
            assert key is not None
            assert compiled.seen(key, float(when)) == reference.seen(key, float(when)), (key, when)
        else:
            compiled.expire(float(when))
            reference.expire(float(when))
        assert compiled.items() == reference.items()
        assert len(compiled) == len(reference) <= max(bound, 0)


@settings(max_examples=200)
@given(st.lists(st.integers(0, 40), min_size=200, max_size=1000), st.sampled_from([3, 8, 9, 16, 30]))
def test_ids_are_found_after_any_evictions(sequences: list[int], bound: int) -> None:
    """Few slots, many ids in and out: every removal's backward shift is exercised."""
    compiled, reference = DedupIds(bound), PyIds(bound)
    for n, sequence in enumerate(sequences):
        key = (sequence % 7, sequence, "s", "p")
        assert compiled.seen(key, float(n)) == reference.seen(key, float(n)), n
    assert compiled.items() == reference.items()


def test_many_ids_stay_within_the_bound_and_found_after_every_growth() -> None:
    compiled, reference = DedupIds(5000), PyIds(5000)
    for n in range(20_000):
        key = (n % 7000, n % 13, "s", "p")
        assert compiled.seen(key, float(n)) == reference.seen(key, float(n))
    assert len(compiled) == 5000
    assert compiled.items() == reference.items()
    compiled.expire(18_000.0)
    reference.expire(18_000.0)
    assert compiled.items() == reference.items()


@pytest.mark.parametrize(
    "key",
    [
        (1, 2, "a"),
        [1, 2, "a", "p"],
        (1.0, 2, "a", "p"),
        (1, 2, b"a", "p"),
        (1, 2, "a", 3),
        "1-2-a",
    ],
)
def test_an_id_of_another_shape_is_refused(key: Any) -> None:
    ids = DedupIds(3)
    with pytest.raises(TypeError):
        ids.seen(key, 1.0)
    assert len(ids) == 0


@pytest.mark.parametrize("key", [(-1, 0, "a", "p"), (0, 2**64, "a", "p")])
def test_an_id_out_of_range_is_refused(key: EventId) -> None:
    ids = DedupIds(3)
    with pytest.raises(OverflowError):
        ids.seen(key, 1.0)
    assert len(ids) == 0


def test_a_bound_past_the_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="at most"):
        DedupIds(MAX_PER_TOPIC + 1)
    with pytest.raises(ConfigError, match="at most"):
        DedupCache(per_topic=MAX_PER_TOPIC + 1)
    assert DedupIds(MAX_PER_TOPIC).bound == MAX_PER_TOPIC


CACHE_OPS = st.lists(
    st.tuples(st.sampled_from(["t", "u", "v", "w"]), KEYS, st.integers(0, 3)),  # topic, id, time step
    max_size=150,
)


@settings(max_examples=300)
@given(CACHE_OPS, st.integers(1, 4), st.integers(1, 3), st.sampled_from([1.0, 5.0, 60.0]))
def test_a_cache_on_either_ids_agrees(
    ops: list[tuple[str, EventId, int]], per_topic: int, topics: int, ttl: float
) -> None:
    caches = [DedupCache(per_topic, ttl, topics, ids=kind) for kind in (PyIds, DedupIds)]
    now = 0.0
    for topic, key, step in ops:
        now += step / 2
        assert caches[0].seen(topic, key, now) == caches[1].seen(topic, key, now)
        for cache in caches:
            cache.touch(topic, 0)
        reference, compiled = caches
        assert (reference.duplicates, reference.forgotten, len(reference)) == (
            compiled.duplicates,
            compiled.forgotten,
            len(compiled),
        )
        for name in ("t", "u", "v", "w"):
            ids = [cache.ids_of(name) for cache in caches]
            assert (ids[0] is None) == (ids[1] is None)
            if ids[0] is not None and ids[1] is not None:
                assert ids[0].items() == ids[1].items()
