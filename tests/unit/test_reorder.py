"""The reorderer: events that travel several brokers come out in each publisher's order, none lost."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.sequence import Reorderer

PUB = 7


def event(r: Reorderer[str], sequence: int, now: float = 0.0, publisher: int = PUB) -> list[str]:
    return r.push(publisher, sequence, False, f"e{sequence}", now)


def heartbeat(r: Reorderer[str], next_sequence: int, now: float = 0.0) -> list[str]:
    return r.push(PUB, next_sequence, True, f"hb{next_sequence}", now)


def test_in_order_events_pass_straight_through() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    assert [x for s in range(5) for x in event(r, s)] == [f"e{s}" for s in range(5)]
    assert r.deadline is None
    assert r.reordered == 0


def test_an_event_ahead_of_a_missing_one_waits_for_it() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    assert event(r, 0) == ["e0"]
    assert event(r, 2, now=5.0) == []
    assert event(r, 3, now=5.1) == []
    assert (r.deadline, r.held, r.reordered) == (6.0, 2, 2)
    assert event(r, 1, now=5.2) == ["e1", "e2", "e3"]
    assert (r.deadline, r.held) == (None, 0)


def test_a_missing_event_is_given_up_after_the_window() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    event(r, 0)
    event(r, 3, now=10.0)
    event(r, 5, now=10.5)
    assert r.expire(10.9) == []
    assert r.expire(11.0) == ["e3"]  # 1..2 are lost; 4 still has until 11.5 (counted from e5's arrival)
    assert r.deadline == 11.5
    assert event(r, 4, now=11.2) == ["e4", "e5"]
    assert event(r, 2, now=11.3) == ["e2"]  # too late: passed on, the tracker drops it as a duplicate


def test_an_expired_event_releases_everything_below_it_in_order() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    event(r, 0)
    event(r, 9, now=1.0)  # arrived first
    event(r, 4, now=1.5)
    assert r.expire(2.0) == ["e4", "e9"]


def test_a_publishers_first_events_wait_for_earlier_ones_on_a_slower_path() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    assert event(r, 27) == []
    assert [x for s in range(27) for x in event(r, s, now=0.1)] == [f"e{s}" for s in range(28)]
    late_joiner: Reorderer[str] = Reorderer(window=1.0)
    assert event(late_joiner, 1000, now=0.0) == []
    assert late_joiner.expire(1.0) == ["e1000"]  # nothing earlier came: it was before our time
    assert event(late_joiner, 1001, now=1.1) == ["e1001"]


def test_a_heartbeat_follows_the_events_it_announces() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    event(r, 0)
    assert heartbeat(r, 1) == ["hb1"]  # announces nothing new
    assert heartbeat(r, 4, now=1.0) == []  # 1..3 are on their way
    assert heartbeat(r, 6, now=1.2) == []  # the newest announcement replaces the older one
    assert event(r, 1, now=1.3) == ["e1"]
    assert [x for s in (2, 3, 4, 5) for x in event(r, s, now=1.4)] == ["e2", "e3", "e4", "e5", "hb6"]
    assert r.deadline is None


def test_a_heartbeat_whose_events_never_come_is_released_after_the_window() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    event(r, 0)
    heartbeat(r, 5, now=1.0)
    event(r, 3, now=1.5)
    assert r.expire(2.0) == ["e3", "hb5"]  # the tracker then reports 1..2 and 4 as lost
    assert event(r, 5, now=2.1) == ["e5"]


def test_a_restarted_publisher_starts_a_new_order() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    for s in range(3):
        event(r, s)
    event(r, 5)
    assert event(r, 0, now=0.5) == ["e5", "e0"]  # what the old stream left, then the new one
    assert event(r, 1, now=0.6) == ["e1"]


def test_holding_is_bounded() -> None:
    r: Reorderer[str] = Reorderer(window=100.0, max_held=3)
    event(r, 0)
    for s in (2, 3, 4):
        assert event(r, s) == []
    assert event(r, 6) == ["e2", "e3", "e4"]  # the hole at 1 is given up; 6 waits for 5
    assert r.held == 1


def test_publishers_are_ordered_independently() -> None:
    r: Reorderer[str] = Reorderer(window=1.0)
    assert event(r, 0, publisher=1) == ["e0"]
    assert event(r, 0, publisher=2) == ["e0"]
    assert event(r, 2, publisher=1) == []
    assert event(r, 1, publisher=2) == ["e1"]
    assert r.expire(1.0) == ["e2"]
    assert r.deadline is None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        Reorderer(window=-1.0)
    with pytest.raises(ValueError, match="max_held"):
        Reorderer(window=1.0, max_held=0)


@st.composite
def two_paths(draw: st.DrawFn) -> tuple[int, list[int]]:
    """Events 0..n-1 over two brokers, each carrying a suffix; merged keeping each path's order."""
    n = draw(st.integers(1, 40))
    starts = [draw(st.integers(0, n - 1)), 0]
    paths = [list(range(start, n)) for start in starts]
    arrivals: list[int] = []
    seen: set[int] = set()
    while any(paths):
        path = draw(st.sampled_from([p for p in paths if p]))
        sequence = path.pop(0)
        if sequence not in seen:  # the transport's dedup cache drops the second copy
            seen.add(sequence)
            arrivals.append(sequence)
    return n, arrivals


@given(two_paths())
def test_any_interleaving_of_two_brokers_comes_out_in_order(case: tuple[int, list[int]]) -> None:
    n, arrivals = case
    r: Reorderer[int] = Reorderer(window=1.0)
    out = [x for s in arrivals for x in r.push(PUB, s, False, s, 0.0)]
    assert out == list(range(n))
    assert r.deadline is None


@given(
    st.lists(st.tuples(st.integers(0, 30), st.floats(0, 0.5)), max_size=60),
    st.lists(st.floats(0, 5), max_size=5),
)
def test_nothing_is_lost_duplicated_or_held_past_the_window(
    arrivals: list[tuple[int, float]], expiries: list[float]
) -> None:
    """Unique events with losses and arbitrary delays: each comes out exactly once, never held too long."""
    r: Reorderer[int] = Reorderer(window=1.0)
    now, out, sent = 0.0, [], set()
    expiries = sorted(expiries)
    for sequence, delay in arrivals:
        now += delay
        while expiries and expiries[0] <= now:
            out += r.expire(expiries.pop(0))
        if sequence in sent:
            continue
        sent.add(sequence)
        out += r.push(PUB, sequence, False, sequence, now)
        out += r.expire(now)
        assert r.deadline is None or r.deadline > now  # what is due is out
    out += r.expire(now + 1.0)
    assert r.deadline is None
    assert sorted(out) == sorted(sent)
    assert len(out) == len(set(out))


def test_publishers_are_forgotten_by_generation_but_never_while_they_wait() -> None:
    r: Reorderer[str] = Reorderer(window=1.0, remembered=4)
    assert event(r, 0) == ["e0"]
    assert event(r, 2) == []  # PUB waits for 1
    for newcomer in range(100):  # many publishers come and go
        assert event(r, 0, publisher=100 + newcomer) == ["e0"]
        assert r.publishers <= 4 + 1  # two generations, and the one that waits
    assert event(r, 1, now=0.5) == ["e1", "e2"]  # still remembered: released in order
    assert (r.held, r.deadline) == (0, None)
