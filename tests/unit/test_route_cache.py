"""The route cache drops exactly the routes of the subjects a changed pattern matches."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.route_cache import BULK, RouteCache
from meshplane.core.mesh.router import Router
from meshplane.core.subjects import matches
from tests.support.subjects import PATTERNS, WORDS

SUBJECTS = st.lists(WORDS, min_size=1, max_size=6).map(".".join)


@given(st.lists(SUBJECTS, min_size=1, max_size=30), st.lists(PATTERNS, min_size=1, max_size=3))
def test_a_change_drops_exactly_the_subjects_its_patterns_match(
    subjects: list[str], patterns: list[str]
) -> None:
    cache: RouteCache[str] = RouteCache(100)
    for subject in subjects:
        cache.put(subject, "route of " + subject)
    cache.invalidate(patterns)
    for subject in set(subjects):
        touched = any(matches(pattern, subject) or pattern == subject for pattern in patterns)
        assert (cache.get(subject) is None) == touched, (subject, patterns)


@given(st.lists(SUBJECTS, min_size=1, max_size=40), st.integers(1, 10))
def test_the_cache_keeps_at_most_its_capacity_newest_first(subjects: list[str], capacity: int) -> None:
    cache: RouteCache[int] = RouteCache(capacity)
    for i, subject in enumerate(subjects):
        cache.put(subject, i)
    assert len(cache) <= capacity
    assert cache.get(subjects[-1]) is not None
    cache.invalidate(["#"] * (BULK + 1))  # a bulk change: everything goes
    assert len(cache) == 0


def test_the_router_keeps_routes_an_unrelated_subscription_does_not_touch() -> None:
    router: Router[str] = Router()
    router.subscribe("h1", "orders.>")
    first = router.route("orders.eu")
    other = router.route("payments.eu")
    router.subscribe("h2", "payments.*")  # touches payments.eu only
    assert router.route("orders.eu") is first  # still the cached object
    assert router.route("payments.eu") is not other
    assert router.route("payments.eu").local == frozenset({"h2"})
