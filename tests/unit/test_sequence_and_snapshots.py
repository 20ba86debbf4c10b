from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.sequence import Arrival, SequenceTracker
from meshplane.core.snapshots import Added, Removed, diff_snapshot


def test_sequence_classification():
    t = SequenceTracker()
    assert t.observe(1, 0).arrival is Arrival.FIRST
    assert t.observe(1, 1).arrival is Arrival.IN_ORDER
    gap = t.observe(1, 5)
    assert (gap.arrival, gap.missing_from, gap.missing_to, gap.missing) == (Arrival.GAP, 2, 4, 3)
    assert t.observe(1, 3).arrival is Arrival.DUPLICATE
    assert t.observe(1, 0).arrival is Arrival.RESTART
    assert t.observe(1, 1).arrival is Arrival.IN_ORDER
    assert t.observe(2, 10).arrival is Arrival.FIRST  # a late joiner's first event is no gap
    assert (t.gaps, t.missing, t.duplicates, t.publishers) == (1, 3, 1, 2)
    t.forget(2)
    assert t.observe(2, 50).arrival is Arrival.FIRST


@given(st.lists(st.integers(0, 40), max_size=60))
def test_missing_counts_exactly_the_skipped_sequences(kept):
    sequences = sorted(set(kept))
    t = SequenceTracker()
    for s in sequences:
        t.observe(7, s)
    if sequences:
        assert t.missing == sequences[-1] - sequences[0] + 1 - len(sequences)


snapshots = st.dictionaries(st.sampled_from("abcdef"), st.binary(max_size=3), max_size=6)


@given(snapshots, st.lists(snapshots, max_size=5))
def test_applying_the_diff_events_reproduces_each_snapshot(first, later):
    known: dict[str, bytes] = {}
    mirror: dict[str, bytes] = {}
    for snapshot in [first, *later]:
        for event in diff_snapshot(known, snapshot):
            if isinstance(event, Added):
                mirror[event.key] = event.value
            else:
                assert isinstance(event, Removed)
                del mirror[event.key]
        assert mirror == snapshot == known
    assert diff_snapshot(known, dict(known)) == []


def test_publishers_silent_for_a_whole_generation_are_forgotten():
    t = SequenceTracker(remembered=4)  # two generations of two
    t.observe(1, 0)
    t.observe(2, 0)
    t.observe(3, 0)  # the newer generation was full: 1 and 2 become the older one
    assert t.observe(1, 1).arrival is Arrival.IN_ORDER  # moved up, still known
    t.observe(4, 0)  # full again: 2 (silent for a generation) is forgotten
    assert (t.publishers, t.forgotten) == (3, 1)
    assert t.observe(2, 5).arrival is Arrival.FIRST  # forgotten: new again, no false gap
    assert t.expect(3, 2).arrival is Arrival.GAP  # 3 was kept: its lost tail is still detected


@given(st.lists(st.integers(0, 300), max_size=400))
def test_memory_is_bounded_and_a_busy_publisher_is_never_forgotten(newcomers):
    t = SequenceTracker(remembered=20)
    busy_next = 0
    for n, publisher in enumerate(newcomers):
        t.observe(1000 + publisher, n)  # unknown or stale ids come and go
        if n % 5 == 0:  # the busy publisher speaks at least once per generation of 10
            assert t.observe(1, busy_next).arrival is (Arrival.FIRST if busy_next == 0 else Arrival.IN_ORDER)
            busy_next += 1
        assert t.publishers <= 20
