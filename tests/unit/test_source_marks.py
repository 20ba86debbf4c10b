"""The last spool offset a queue stored per source (issue 53, item 2): a resend from any point is
known, whatever other sources sent in between; bounded by sources, the least recent forgotten; a
checkpoint newer than its topic is refused."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.mesh.source_marks import SourceMarks

SOURCES = st.sampled_from(["a", "b", "c", "@x", "@y"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(SOURCES, st.integers(0, 5), st.booleans()), max_size=80), st.integers(2, 5))
def test_a_resend_is_known_exactly_when_its_offset_was_stored(
    steps: list[tuple[str, int, bool]], bound: int
) -> None:
    """Each source sends offsets that grow (by a step) and sometimes resends from any earlier one."""
    marks = SourceMarks(max_sources=bound)
    stored: dict[str, set[int]] = {}
    sent: dict[str, int] = {}
    order: list[str] = []  # sources by their last store, oldest first
    for now, (source, step, resend) in enumerate(steps):
        if resend and stored.get(source):
            offset = sorted(stored[source])[step % len(stored[source])]
        else:
            offset = sent[source] = sent.get(source, -1) + 1 + step
        assert marks.seen(source, offset) == (offset in stored.get(source, ()))
        if not marks.seen(source, offset):
            marks.stored(source, offset, now)
            stored.setdefault(source, set()).add(offset)
            if source in order:
                order.remove(source)
            order.append(source)
            if len(order) > bound:  # the least recent is forgotten (a resend of it is stored again)
                del stored[order.pop(0)]
        assert len(marks) == len(order)
    again = SourceMarks(max_sources=bound)
    assert again.load(marks.encode(100), 100) == 100
    for source in order:
        assert again.last(source) == marks.last(source) == max(stored[source])


def test_a_checkpoint_that_does_not_fit_the_topic_is_refused() -> None:
    marks = SourceMarks()
    marks.stored("a", 7, 1)
    raw = marks.encode(50)
    assert SourceMarks().load(raw, 49) is None  # the topic lost its tail: read it whole
    assert SourceMarks().load(b"{", 50) is None
    fresh = SourceMarks()
    assert fresh.load(raw, 60) == 50
    assert fresh.seen("a", 7)
    assert not fresh.seen("a", 8)
    assert not fresh.seen("b", 0)
