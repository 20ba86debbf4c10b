"""The room view (pure): the ring every backend serves history, replays and pushes from."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.streamlog import StoredEvent
from meshplane.streams.events import StreamEvent
from meshplane.streams.rooms import Room


def events(first: int, count: int) -> list[StreamEvent]:
    return [
        StreamEvent(first + i, 1_000, StoredEvent(str(first + i), "e", first + i), 10) for i in range(count)
    ]


def test_events_past_a_hole_restart_the_history_there() -> None:
    room = Room("r", max_events=100, retention_secs=None, created_at=0.0)
    room.add(events(0, 5), now=1_000)
    room.add(events(8, 2), now=1_000)  # 5..7 were removed before they were read
    assert (room.oldest, room.next_offset, len(room)) == (8, 10, 2)
    assert [e.offset for e in room.read(8, 10)] == [8, 9]
    assert room.ring_bytes == 20


def test_a_restart_leaves_an_empty_history_at_the_offset() -> None:
    room = Room("r", max_events=100, retention_secs=None, created_at=0.0)
    room.add(events(0, 3), now=1_000)
    room.restart_at(4)  # offset 3 was unreadable
    assert (room.oldest, room.next_offset, len(room), room.ring_bytes) == (4, 4, 0, 0)
    room.add(events(4, 1), now=1_000)
    assert [e.offset for e in room.read(room.resolve(None), 5)] == []  # None: only new events
    assert [e.offset for e in room.read(room.resolve(4), 5)] == [4]


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40)),  # (hole before the batch, batch size)
        max_size=30,
    ),
    st.integers(1, 50),
)
def test_the_history_is_the_newest_contiguous_events_within_max_events(
    batches: list[tuple[int, int]], max_events: int
) -> None:
    room = Room("r", max_events=max_events, retention_secs=None, created_at=0.0)
    stored: list[int] = []
    for hole, size in batches:
        first = room.next_offset + hole
        if hole:
            stored.clear()  # the history restarts after a hole
        room.add(events(first, size), now=1_000)
        stored.extend(range(first, first + size))
    expected = stored[-max_events:]
    held = room.read(room.oldest, 10_000)
    assert [e.offset for e in held] == expected
    assert len(room) == len(expected)
    assert room.ring_bytes == 10 * len(expected)
    if expected:
        assert (room.oldest, room.next_offset) == (expected[0], expected[-1] + 1)
        middle = expected[len(expected) // 2]
        assert [e.offset for e in room.read(middle, 3)] == expected[len(expected) // 2 :][:3]
