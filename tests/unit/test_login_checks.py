"""The password checks' queue (issue 58): bounded, and fair by source address and by user name, under
every interleaving of logins offered, started, finished and gone that hypothesis draws."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.mesh.login_checks import ADDRESS_BUSY, QUEUE_FULL, CheckLimits, LoginChecks

LIMITS = st.builds(
    CheckLimits,
    slots=st.integers(1, 4),
    per_address=st.integers(1, 3),
    per_user=st.integers(1, 3),
    queued=st.integers(1, 12),
    queued_per_address=st.integers(1, 5),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.sampled_from("ABCD"), st.sampled_from("uvw")),
        st.tuples(st.just("done"), st.integers(0, 30), st.just("")),
        st.tuples(st.just("cancel"), st.integers(0, 30), st.just("")),
    ),
    max_size=60,
)


@settings(max_examples=400)
@given(LIMITS, OPS)
def test_checks_stay_within_their_bounds_leave_no_slot_idle_and_take_turns(
    limits: CheckLimits, ops: list[tuple[str, object, str]]
) -> None:
    checks: LoginChecks[int] = LoginChecks(limits)
    ids = itertools.count()
    waiting: dict[int, tuple[str, str]] = {}  # the model: id -> (address, user), oldest first
    running: dict[int, tuple[str, str]] = {}
    # (A, X): how many checks address X started while A had a check that could start
    overtaken: Counter[tuple[str, str]] = Counter()

    def could_start(address: str) -> bool:
        by_address = Counter(a for a, _ in running.values())
        by_user = Counter(u for _, u in running.values())
        return by_address[address] < limits.per_address and any(
            a == address and by_user[u] < limits.per_user for a, u in waiting.values()
        )

    def start() -> None:
        for who in checks.start():
            address, user = waiting.pop(who)
            for other in {a for a, _ in waiting.values()} - {address}:
                if not could_start(other):  # its wait for a turn begins again once it could start
                    overtaken.update({k: -n for k, n in overtaken.items() if k[0] == other})
                    continue
                overtaken[(other, address)] += 1
                assert overtaken[(other, address)] <= 1, f"{address} started twice while {other} waited"
            overtaken.update({k: -n for k, n in overtaken.items() if k[0] == address})
            running[who] = (address, user)
        # no slot idle while a waiting check could take it
        assert len(running) == limits.slots or not any(could_start(a) for a, _ in waiting.values())

    for op, arg, user in ops:
        if op == "offer":
            assert isinstance(arg, str)
            who = next(ids)
            by_address = sum(1 for a, _ in waiting.values() if a == arg)
            reason = checks.offer(who, arg, user)
            if by_address >= limits.queued_per_address:
                assert reason == ADDRESS_BUSY
            elif len(waiting) >= limits.queued:
                assert reason == QUEUE_FULL
            else:
                assert reason == ""
                waiting[who] = (arg, user)
        else:
            assert isinstance(arg, int)
            known = sorted(running) if op == "done" else sorted(running) + sorted(waiting)
            if not known:
                continue
            who = known[arg % len(known)]
            checks.done(who) if op == "done" else checks.cancel(who)
            running.pop(who, None)
            waiting.pop(who, None)
        start()
        assert checks.running == len(running) <= limits.slots
        assert checks.waiting == len(waiting) <= limits.queued
        assert max(Counter(a for a, _ in running.values()).values(), default=0) <= limits.per_address
        assert max(Counter(u for _, u in running.values()).values(), default=0) <= limits.per_user
        assert max(Counter(a for a, _ in waiting.values()).values(), default=0) <= limits.queued_per_address


def test_a_newcomer_is_checked_next_whatever_one_address_has_queued() -> None:
    """The flood's case: address F fills its share of the queue with user alice's checks; alice from
    address N is checked as soon as F's running check of her name ends, before any more of F's."""
    checks: LoginChecks[str] = LoginChecks(CheckLimits(slots=2, per_address=1, per_user=1))
    for i in range(8):
        assert checks.offer(f"f{i}", "F", "alice") == ""
    assert checks.offer("f8", "F", "alice") == ADDRESS_BUSY
    assert checks.start() == ["f0"]  # one slot stays free for other addresses and users
    assert checks.offer("n", "N", "alice") == ""
    assert checks.start() == []  # alice's name is being checked already
    checks.done("f0")
    assert checks.start() == ["n"]
    assert checks.offer("m", "M", "bob") == ""
    assert checks.start() == ["m"]  # another user takes the other slot at once


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="1 or more"):
        CheckLimits(per_address=0)
