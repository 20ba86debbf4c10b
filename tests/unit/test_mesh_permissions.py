"""Mesh users' permissions (issue 58) against a reference model: every subject of a small universe
that patterns of at most 3 fixed tokens can tell apart (words a, b and an "other" word x, at most 5
tokens), each decided by the definition of matching."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.permissions import Permissions, Rules, covers, intersects
from tests.unit.test_subjects import reference

TOKENS = st.sampled_from(["a", "b", "*"])
PATTERNS = (
    st.tuples(st.lists(TOKENS, min_size=0, max_size=3), st.sampled_from(["", ">", "#"]))
    .filter(lambda p: p[0] or p[1])
    .map(lambda p: ".".join([*p[0], p[1]] if p[1] else p[0]))
)
UNIVERSE = [".".join(words) for n in range(1, 6) for words in itertools.product("abx", repeat=n)]


def subjects_of(pattern: str) -> set[str]:
    return {subject for subject in UNIVERSE if reference(pattern, subject)}


@given(PATTERNS, PATTERNS)
def test_intersects_and_covers_agree_with_the_definition(a: str, b: str) -> None:
    assert intersects(a, b) == bool(subjects_of(a) & subjects_of(b))
    assert covers(a, b) == (subjects_of(b) <= subjects_of(a))


RULES = st.builds(Rules, st.lists(PATTERNS, max_size=3).map(tuple), st.lists(PATTERNS, max_size=3).map(tuple))


@given(RULES, RULES, st.sampled_from(UNIVERSE), PATTERNS)
def test_deny_wins_and_a_subscription_that_could_reach_a_denied_subject_is_refused(
    publish: Rules, subscribe: Rules, subject: str, pattern: str
) -> None:
    permissions = Permissions(publish, subscribe)
    allowed = (not publish.allow or any(reference(p, subject) for p in publish.allow)) and not any(
        reference(p, subject) for p in publish.deny
    )
    assert (permissions.why_not_publish(subject) == "") == allowed
    assert (permissions.why_not_publish(subject) == "") == allowed  # the remembered decision
    reached = subjects_of(pattern)
    may = (not subscribe.allow or any(reached <= subjects_of(p) for p in subscribe.allow)) and not any(
        reached & subjects_of(p) for p in subscribe.deny
    )
    assert (permissions.why_not_subscribe(pattern) == "") == may


def test_reasons_say_what_refused() -> None:
    permissions = Permissions(Rules(("orders.>",), ("orders.secret.>",)), Rules((), ("orders.secret.>",)))
    assert permissions.why_not_publish("orders.eu") == ""
    assert "denied by 'orders.secret.>'" in permissions.why_not_publish("orders.secret.x")
    assert "not allowed" in permissions.why_not_publish("payments.eu")
    assert "could match subjects denied" in permissions.why_not_subscribe("orders.>")
    assert permissions.why_not_subscribe("orders.eu.*") == ""
    with pytest.raises(ValueError, match="not a valid pattern"):
        Rules(("a..b",))


def test_a_check_costs_linear_time_in_the_patterns() -> None:
    """32-token patterns built to make a backtracking matcher explode cost a token walk each."""
    hard = ".".join(["*"] * 31) + ".>"
    rules = Rules(tuple(hard.replace("*", "w", i) for i in range(31)), (".".join(["w"] * 31) + ".#",))
    permissions = Permissions(rules, rules)
    started = time.perf_counter()
    for _ in range(200):
        permissions.why_not_subscribe(".".join(["*"] * 30) + ".#")
    per_check = (time.perf_counter() - started) / 200
    assert per_check < 0.01, per_check  # generous: about 62 patterns x 32 tokens each
