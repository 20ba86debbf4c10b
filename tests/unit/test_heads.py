"""Heads and tails, pure: whatever a subscriber hears of a publisher (any lost head, lost tail, copies
through several brokers, heartbeats early or late), every sequence is delivered once or reported
missing once, a late join is never a loss, and a goodbye is a leave, reported once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.envelope import EventEnvelope
from meshplane.core.framing import Frame, MessageType
from meshplane.core.heads import (
    NO_NEWS,
    HeadTracker,
    HeartbeatNews,
    JoinedLate,
    PublisherLeft,
    decode_news,
    encode_news,
)
from meshplane.core.intake import Intake
from meshplane.core.sequence import EventGap
from meshplane.core.tally import OTHER, Count, PublisherTally
from meshplane.errors import MalformedFrame

TOPIC = "kv"
SUBSCRIBED_AT = 100.0


def event(publisher: int, sequence: int) -> Frame:
    return Frame(MessageType.EVENT, EventEnvelope(publisher, sequence, 0, TOPIC, b"e"), TOPIC.encode())


def heartbeat(publisher: int, next_sequence: int, age: float, final: bool = False) -> Frame:
    news = encode_news(int(age * 1000), final)
    envelope = EventEnvelope(publisher, next_sequence, 0, TOPIC, news)
    return Frame(MessageType.HEARTBEAT, envelope, TOPIC.encode())


def intake(liveness: float | None = None) -> Intake:
    return Intake(
        TOPIC, [TOPIC.encode()], liveness_timeout=liveness, reorder_window=0.5, subscribed_at=SUBSCRIBED_AT
    )


# --- the news in a heartbeat ----------------------------------------------------------------------------


@given(st.integers(0, 2**62), st.booleans())
def test_news_round_trips(uptime_ms: int, final: bool) -> None:
    assert decode_news(encode_news(uptime_ms, final)) == HeartbeatNews(uptime_ms, final)


def test_an_empty_payload_is_no_news_and_unknown_keys_are_ignored() -> None:
    assert decode_news(b"") is NO_NEWS
    assert decode_news(b"\x82\xa9uptime_ms\x05\xa5later\xc3") == HeartbeatNews(5, False)


@given(st.binary(min_size=1, max_size=40))
def test_any_other_payload_is_malformed_or_news(payload: bytes) -> None:
    try:
        news = decode_news(payload)
    except MalformedFrame:
        return
    assert news.uptime_ms is None or news.uptime_ms >= 0


# --- the head tracker alone -----------------------------------------------------------------------------


@given(
    st.integers(0, 50),
    st.floats(0, 200),
    st.booleans(),
)
def test_a_head_is_judged_once_whichever_news_comes_first(
    first: int, started_at: float, age_first: bool
) -> None:
    heads = HeadTracker(SUBSCRIBED_AT)
    if age_first:
        results = [heads.started(7, started_at), heads.first(7, first)]
    else:
        results = [heads.first(7, first), heads.started(7, started_at)]
    reported = [r for r in results if r is not None]
    if first == 0:
        assert reported == []
    elif started_at >= SUBSCRIBED_AT:
        assert reported == [EventGap(7, 0, first - 1)]
    else:
        assert reported == [JoinedLate(7, first)]
        assert heads.joined_late == first
    assert heads.started(7, started_at) is None or first == 0  # never twice
    assert heads.waiting <= 1


def test_the_earliest_age_wins_and_memory_is_bounded() -> None:
    heads = HeadTracker(SUBSCRIBED_AT, remembered=3)
    heads.started(1, SUBSCRIBED_AT + 1)  # a heartbeat held up on its way
    heads.started(1, SUBSCRIBED_AT - 1)  # the true age, nearer
    assert heads.first(1, 4) == JoinedLate(1, 4)
    for publisher in range(10, 20):
        heads.first(publisher, 3)
    assert heads.waiting == 3
    assert heads.given_up == 7


# --- the intake: heads, tails and leaves, for any arrival pattern ---------------------------------------

PUBLISHER = 5


@given(
    sent=st.integers(1, 40),
    head_lost=st.integers(0, 10),
    tail_lost=st.integers(0, 10),
    data=st.data(),
    began_after=st.booleans(),
    copies=st.integers(1, 2),
)
def test_every_sequence_arrives_once_or_is_reported_missing_once(
    sent: int, head_lost: int, tail_lost: int, data: st.DataObject, began_after: bool, copies: int
) -> None:
    """A publisher sends ``sent`` events; the first ``head_lost`` and the last ``tail_lost`` never come,
    some between are lost too; heartbeats come anywhere, ``copies`` times (brokers);
    then its goodbye. It began before or after the subscriber (by its heartbeats' age)."""
    head_lost, tail_lost = min(head_lost, sent), min(tail_lost, sent - min(head_lost, sent))
    middle = range(head_lost, sent - tail_lost)
    lost = data.draw(st.sets(st.sampled_from(middle))) if middle else set()
    born = SUBSCRIBED_AT + 1 if began_after else SUBSCRIBED_AT - 1
    now = SUBSCRIBED_AT + 2
    arrivals: list[Frame] = []
    for sequence in middle:
        if sequence not in lost:
            arrivals.append(event(PUBLISHER, sequence))
        if data.draw(st.booleans()):
            arrivals.append(heartbeat(PUBLISHER, sequence + 1, now - born))
    arrivals.append(heartbeat(PUBLISHER, sent, now - born, final=True))
    machine = intake(liveness=3.0)
    delivered: list[int] = []
    notices = []
    for item in arrivals:
        # Heartbeats come once per broker; events' copies are dropped before (the transport's dedup).
        for _ in range(copies if item.message_type is MessageType.HEARTBEAT else 1):
            out = machine.accept([item], now, paths=1)
            delivered += [e.sequence for e in out.envelopes]
            notices += out.notices
    missing = [s for n in notices if isinstance(n, EventGap) for s in range(n.missing_from, n.missing_to + 1)]
    assert len(delivered) == len(set(delivered))
    assert len(missing) == len(set(missing))
    assert delivered == [s for s in middle if s not in lost]
    # The first news: the first event that arrived, or a heartbeat's next sequence (the goodbye's at last).
    first = arrivals[0].envelope.sequence
    late = [n for n in notices if isinstance(n, JoinedLate)]
    if began_after or first == 0:
        assert late == []
        assert sorted(delivered + missing) == list(range(sent))  # all of it, from 0
    else:
        assert late == [JoinedLate(PUBLISHER, first)]  # what came before it was not for this subscriber
        assert sorted(delivered + missing) == list(range(first, sent))
    assert [n for n in notices if isinstance(n, PublisherLeft)] == [PublisherLeft(PUBLISHER, sent)]
    assert machine.tracker.missing == len(missing)
    assert machine.liveness is not None
    assert machine.liveness.tracked == 0


def test_a_late_joiner_is_told_where_it_came_in() -> None:
    machine = intake()
    now = SUBSCRIBED_AT + 1
    out = machine.accept([event(1, 7), event(1, 8), heartbeat(1, 9, age=10)], now)
    assert [e.sequence for e in out.envelopes] == [7, 8]
    assert out.notices == [JoinedLate(1, 7)]
    assert (machine.tracker.gaps, machine.heads is not None and machine.heads.joined_late) == (0, 7)


def test_a_lost_head_is_a_gap_reported_when_the_age_is_known() -> None:
    machine = intake()
    now = SUBSCRIBED_AT + 1
    assert machine.accept([event(1, 3)], now).notices == []
    assert machine.accept([heartbeat(1, 4, age=0.5)], now).notices == [EventGap(1, 0, 2)]
    assert (machine.tracker.gaps, machine.tracker.missing) == (1, 3)
    assert machine.tally.rows[1][Count.MISSING] == 3


def test_a_malformed_heartbeat_payload_is_counted_and_dropped() -> None:
    machine = intake()
    bad = Frame(MessageType.HEARTBEAT, EventEnvelope(1, 4, 0, TOPIC, b"\xc1"), TOPIC.encode())
    out = machine.accept([bad], SUBSCRIBED_AT)
    assert machine.malformed["malformed"] == 1
    assert len(out.new_errors) == 1
    assert machine.heartbeats == 0


def test_copies_after_a_goodbye_are_dropped_not_taken_for_a_new_publisher() -> None:
    machine = intake(liveness=1.0)
    goodbye = heartbeat(1, 1, age=1, final=True)
    out = machine.accept([event(1, 0), goodbye, event(1, 0), goodbye], SUBSCRIBED_AT + 2)
    assert [e.sequence for e in out.envelopes] == [0]
    assert out.notices == [PublisherLeft(1, 1)]
    assert machine.after_leave == 2
    assert machine.left == 1
    assert machine.liveness is not None
    assert machine.liveness.check(SUBSCRIBED_AT + 100) == []


# --- per-publisher counts -------------------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(0, 30), st.sampled_from(list(Count)), st.integers(1, 5))),
    st.integers(1, 10),
)
def test_the_tally_is_bounded_and_its_totals_never_go_down(
    adds: list[tuple[int, Count, int]], capacity: int
) -> None:
    tally = PublisherTally(capacity)
    totals = [0] * len(Count)
    for step, (publisher, count, n) in enumerate(adds):
        tally.add(publisher, count, n)
        totals[count] += n
        if step % 3 == 0:
            tally.fold(publisher)  # it left
        assert len([p for p in tally.rows if p != OTHER]) <= capacity
        for top in (0, 2):
            rows = tally.top(top)
            assert len(rows) <= top + 1
            assert [sum(row[c] for _, row in rows) for c in range(len(Count))] == totals
