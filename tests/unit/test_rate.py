"""The token bucket of a VPN's publish limits: never more than ``burst + rate * elapsed`` taken in
any window, and a steady sender at the rate is never refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.rate import TokenBucket

TAKES = st.lists(st.tuples(st.floats(0, 2), st.floats(0, 30)), max_size=60)  # (seconds since last, n)


@given(st.floats(1, 100), st.floats(1, 100), TAKES)
def test_what_is_taken_never_passes_the_burst_plus_the_rate(
    rate: float, burst: float, takes: list[tuple[float, float]]
) -> None:
    bucket = TokenBucket(rate, burst)
    now, taken = 0.0, []
    for gap, n in takes:
        now += gap
        if bucket.take(n, now):
            taken.append((now, n))
    for i, (start, _) in enumerate(taken):  # every window that starts at a take
        window = [(t, n) for t, n in taken[i:]]
        for end, _ in window:
            spent = sum(n for t, n in window if t <= end)
            assert spent <= burst + rate * (end - start) + 1e-6 * len(window)


@given(st.floats(1, 100), st.integers(1, 50))
def test_a_sender_at_the_rate_is_never_refused(rate: float, sends: int) -> None:
    bucket = TokenBucket(rate, burst=1)
    assert all(bucket.take(1, i / rate) for i in range(sends))


def test_a_refused_take_spends_nothing_and_time_refills() -> None:
    bucket = TokenBucket(rate=10, burst=10)
    assert bucket.take(10, 0.0)
    assert not bucket.take(1, 0.0)
    assert not bucket.take(6, 0.5)  # 5 back
    assert bucket.take(5, 0.5)
    assert bucket.take(10, 100.0)  # no more than the burst saved
    assert not bucket.take(1, 100.0)
    with pytest.raises(ValueError, match="above 0"):
        TokenBucket(0, 1)
