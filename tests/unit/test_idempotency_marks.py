"""Idempotency marks (core.idempotency): the answer to an idempotent publish rebuilt from its events'
marks, whatever partitions the batch spread over; a batch missing a partition's run is not rebuilt."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.idempotency import decode_mark, encode_mark, marked, reassemble, runs_of
from meshplane.core.streamlog import MarkedEvent, StoredEvent

keys = st.text(min_size=1, max_size=40)
spreads = st.lists(st.integers(0, 4), min_size=1, max_size=40)  # event i goes to partition spreads[i]


def appended(
    partitions: list[int], bases: dict[int, int]
) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """The places a log gives (each partition's run at consecutive offsets from its base), and
    (partition, offset, batch index) of each event."""
    places: list[tuple[int, int]] = []
    taken: dict[int, int] = {}
    for p in partitions:
        places.append((p, bases[p] + taken.get(p, 0)))
        taken[p] = taken.get(p, 0) + 1
    return places, [(p, o, i) for i, (p, o) in enumerate(places)]


@given(spreads, keys, st.dictionaries(st.integers(0, 4), st.integers(0, 10**9), min_size=5, max_size=5))
def test_the_answer_is_rebuilt_from_the_marks(partitions: list[int], key: str, bases: dict[int, int]) -> None:
    events = marked([StoredEvent(str(i), "e") for i in range(len(partitions))], partitions, key)
    places, where = appended(partitions, bases)
    marks = [(p, o, e) for p, o, i in where if isinstance(e := events[i], MarkedEvent)]
    assert len(marks) == len(set(partitions))  # one mark per partition's run, on its last event
    found = [(p, o, decode_mark(e.idempotency or "")) for p, o, e in marks]
    assert reassemble((p, o, m) for p, o, m in found if m is not None) == {key: places}
    if len(marks) > 1:  # a partition's run lost (never acknowledged): nothing to rebuild
        assert reassemble((p, o, m) for p, o, m in found[1:] if m is not None) == {}


@given(st.text(max_size=60))
def test_anything_that_is_not_a_mark_decodes_to_none_and_never_raises(text: str) -> None:
    mark = decode_mark(text)
    if mark is not None:
        assert encode_mark(mark.key, mark.total, mark.indexes) == text


def test_marks_name_ranges_of_batch_indexes() -> None:
    assert runs_of([1, 0, 1, 1]) == {1: [0, 2, 3], 0: [1]}
    assert encode_mark("k 1", 4, [0, 2, 3]) == "4 0-1,2-4 k 1"
    mark = decode_mark("4 0-1,2-4 k 1")
    assert mark is not None
    assert (mark.key, mark.total, mark.indexes) == ("k 1", 4, (0, 2, 3))
    for bad in ("", "4 0-1", "x 0-1 k", "4 1-0 k", "4 0-5 k", "4 2-3,0-1 k", "4 0-1 "):
        assert decode_mark(bad) is None, bad
