"""Each Message VPN's bytes in a spool (issue 58: ``max_spool_bytes``) against a reference: the sum of
its events' sizes at offsets not confirmed yet, whatever the order of appends and confirmations; and
counted again from the log when a spool is opened."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.frames import FLAG_GUARANTEED, encode_event
from meshplane.core.mesh.spool_shares import RUN_EVENTS, SpoolShares
from meshplane.mesh.spool import Spool, SpoolLimits
from meshplane.streams.files import FilePool

STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.lists(st.sampled_from(["default", "A", "B"]), min_size=1, max_size=6),
            st.integers(0, 5000),
        ),
        st.tuples(st.just("confirm"), st.integers(0, 3), st.just(0)),
    ),
    max_size=200,
)


@given(STEPS, st.integers(0, 10**6))
def test_each_vpns_bytes_are_those_of_its_events_not_confirmed(
    steps: list[tuple[str, object, int]], start: int
) -> None:
    shares = SpoolShares(start)
    events: list[tuple[str, int]] = []  # at offsets start, start + 1, ...
    acked = start
    for kind, what, size in steps:
        if kind == "add":  # a batch: its events of ``what`` VPNs, of sizes from ``size`` on
            assert isinstance(what, list)
            sizes = [size + n for n in range(len(what))]
            shares.added(start + len(events), what, sizes)
            events.extend(zip(what, sizes, strict=True))
        else:
            assert isinstance(what, int)
            acked = min(acked + what, start + len(events))  # confirmations move on, within what was sent
            shares.confirmed(acked)
        expected: dict[str, int] = {}
        for vpn, event_size in events[acked - start :]:
            expected[vpn] = expected.get(vpn, 0) + event_size
        assert {vpn: n for vpn, n in shares.bytes.items() if n} == {v: n for v, n in expected.items() if n}


def test_a_long_run_of_one_vpn_is_released_as_it_is_confirmed() -> None:
    shares = SpoolShares()
    shares.added(0, ["A"] * 10, [10] * 10)
    shares.added(10, ["A"] * RUN_EVENTS * 2, [10] * RUN_EVENTS * 2)  # runs of RUN_EVENTS at most
    shares.confirmed(RUN_EVENTS + 5)
    assert shares.bytes["A"] == (RUN_EVENTS + 5) * 10
    shares.confirmed(RUN_EVENTS * 2 + 10)
    assert not shares.bytes


def test_a_spool_opened_again_counts_each_vpns_bytes_from_its_log(tmp_path: Path) -> None:
    def frame(subject: str, i: int) -> bytes:
        return encode_event("origin", subject, i, 1_700_000_000_000 + i, b"x" * 100, FLAG_GUARANTEED)

    frames = [frame("$vpn:A.orders" if i % 3 else "orders", i) for i in range(30)]
    spool = Spool(tmp_path, "b", SpoolLimits(segment_bytes=2_000), FilePool(16))
    spool.append(frames, ["A" if i % 3 else "default" for i in range(30)])
    spool.confirm(5)  # 0-5 confirmed
    spool.save()
    counted = dict(spool.shares.bytes)
    assert counted == {
        "A": sum(len(f) for i, f in enumerate(frames) if i > 5 and i % 3),
        "default": sum(len(f) for i, f in enumerate(frames) if i > 5 and not i % 3),
    }
    spool.close()
    again = Spool(tmp_path, "b", SpoolLimits(segment_bytes=2_000), FilePool(16))
    assert dict(again.shares.bytes) == counted
    again.close()
