from meshplane import EventTimeout, PublisherRecovered
from meshplane.core.liveness import LivenessTracker
from meshplane.core.sequence import Arrival, SequenceTracker


def test_a_silent_publisher_times_out_once_and_recovers():
    t = LivenessTracker(timeout=3.0)
    assert t.seen(1, 0.0) is None
    t.seen(2, 0.0)
    assert t.check(2.9) == []
    t.seen(2, 2.9)
    assert t.check(3.5) == [EventTimeout(1, 3.5)]
    assert t.check(10.0) == [EventTimeout(2, 10.0 - 2.9)]
    assert t.check(20.0) == []  # reported once per silence
    assert t.is_timed_out(1)
    assert t.seen(1, 21.0) == PublisherRecovered(1, 21.0)
    assert not t.is_timed_out(1)
    assert (t.timeouts, t.recoveries) == (2, 1)
    t.forget(2)
    assert t.check(100.0) == [EventTimeout(1, 79.0)]
    assert t.tracked == 1


def test_heartbeats_reveal_a_lost_tail():
    s = SequenceTracker()
    assert s.expect(7, 5).arrival is Arrival.FIRST  # a late joiner: no gap for what came before
    assert s.observe(7, 5).arrival is Arrival.IN_ORDER
    assert s.expect(7, 6).arrival is Arrival.IN_ORDER
    gap = s.expect(7, 10)  # events 6..9 were sent and never arrived
    assert (gap.arrival, gap.missing_from, gap.missing_to) == (Arrival.GAP, 6, 9)
    assert s.expect(7, 8).arrival is Arrival.IN_ORDER  # stale news changes nothing
    assert s.observe(7, 10).arrival is Arrival.IN_ORDER
    assert (s.gaps, s.missing) == (1, 4)


def test_silent_says_what_check_would_report_without_reporting_it():
    liveness = LivenessTracker(timeout=1.0)
    liveness.seen(1, 0.0)
    liveness.seen(2, 0.5)
    assert liveness.silent(1.2) == [1]
    assert liveness.silent(1.2) == [1]  # asking changes nothing
    liveness.forget(1)  # it left cleanly: never reported
    assert [n.publisher_id for n in liveness.check(1.6)] == [2]
    assert (liveness.silent(1.6), liveness.timeouts, liveness.timed_out) == ([], 1, [2])
