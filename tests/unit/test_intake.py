"""The subscriber's arrival pipeline, pure: what it delivers and reports for any arrival pattern."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.envelope import EventEnvelope
from meshplane.core.framing import Frame, MessageType
from meshplane.core.intake import Intake
from meshplane.core.liveness import EventTimeout, PublisherRecovered
from meshplane.core.sequence import EventGap
from meshplane.errors import MalformedFrame, TruncatedFrame, WireError

TOPIC = "kv"


def frame(publisher: int, sequence: int, heartbeat: bool = False, topic: str = TOPIC) -> Frame:
    kind = MessageType.HEARTBEAT if heartbeat else MessageType.EVENT
    return Frame(kind, EventEnvelope(publisher, sequence, 0, topic, b""), topic.encode())


def intake(window: float = 1.0, liveness: float | None = None) -> Intake:
    return Intake(TOPIC, [TOPIC.encode()], liveness_timeout=liveness, reorder_window=window)


def delivered(events: list[EventEnvelope]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for e in events:
        out.setdefault(e.publisher_id, []).append(e.sequence)
    return out


def assert_same_counters(got: Intake, expected: Intake) -> None:
    for counter in ("gaps", "missing", "duplicates"):
        assert getattr(got.tracker, counter) == getattr(expected.tracker, counter)
    assert (got.received, got.heartbeats) == (expected.received, expected.heartbeats)


SENT = st.dictionaries(st.integers(1, 4), st.integers(1, 30), min_size=1, max_size=3)  # publisher -> events


@given(SENT, st.data())
def test_one_path_delivers_each_event_once_in_order_and_reports_exactly_what_is_missing(
    sent: dict[int, int], data: st.DataObject
) -> None:
    machine = intake()
    arrivals: list[Frame] = []
    kept: dict[int, list[int]] = {}
    for publisher, count in sent.items():
        lost = data.draw(st.sets(st.integers(1, count - 1))) if count > 1 else set()  # the first arrives
        kept[publisher] = [s for s in range(count) if s not in lost]
        # Resent duplicates (not of event 0: on the wire, a 0 after later events is a restart).
        again = [q for q in kept[publisher] if q > 0]
        copies = data.draw(st.lists(st.sampled_from(again), max_size=5)) if again else []
        arrivals += [frame(publisher, s) for s in sorted(kept[publisher] + copies)]
    # Publishers interleave; each one's own events keep their order on one path.
    order = data.draw(st.permutations(range(len(arrivals))))
    by_publisher: dict[int, list[Frame]] = {}
    for f in arrivals:
        by_publisher.setdefault(f.envelope.publisher_id, []).append(f)
    stream = []
    cursors = dict.fromkeys(by_publisher, 0)
    for i in order:
        publisher = arrivals[i].envelope.publisher_id
        stream.append(by_publisher[publisher][cursors[publisher]])
        cursors[publisher] += 1
    outcome = machine.accept(stream, now=0.0)
    assert delivered(outcome.envelopes) == {p: seqs for p, seqs in kept.items()}
    missing = {
        (n.publisher_id, s)
        for n in outcome.notices
        if isinstance(n, EventGap)
        for s in range(n.missing_from, n.missing_to + 1)
    }
    expected = {
        (p, s) for p, count in sent.items() for s in range(count) if s not in kept[p] and s < max(kept[p])
    }
    assert missing == expected
    assert machine.received == sum(len(v) for v in kept.values())


@given(SENT, st.data())
def test_two_paths_deliver_every_event_that_arrived_on_either_once_and_in_order(
    sent: dict[int, int], data: st.DataObject
) -> None:
    machine = intake(window=1.0)
    paths: list[list[Frame]] = [[], []]
    arrived: dict[int, set[int]] = {}
    for publisher, count in sent.items():
        for s in range(count):
            on = data.draw(st.sampled_from([(0,), (1,), (0, 1), (0, 1)]))  # one copy may be lost
            for path in on:
                paths[path].append(frame(publisher, s))
            arrived.setdefault(publisher, set()).add(s)
    # Each path keeps its order; the two interleave in any way.
    merged: list[Frame] = []
    a, b = list(paths[0]), list(paths[1])
    while a or b:
        take_a = bool(a) and (not b or data.draw(st.booleans()))
        merged.append((a if take_a else b).pop(0))
    got: list[EventEnvelope] = []
    seen: set[tuple[int, int]] = set()
    for f in merged:
        key = (f.envelope.publisher_id, f.envelope.sequence)
        if key in seen:  # the broker transport drops the second copy before the intake (DedupCache)
            continue
        seen.add(key)
        got += machine.accept([f], now=0.0, paths=2).envelopes
    got += machine.tick(now=10.0, paths=2).envelopes  # the window is over: what waits goes out
    assert machine.deadline is None
    assert delivered(got) == {p: sorted(seqs) for p, seqs in arrived.items()}


def test_bad_input_is_counted_and_logged_once_per_reason() -> None:
    machine = intake()
    batch: list[Frame | WireError] = [
        MalformedFrame("x"),
        MalformedFrame("y"),
        TruncatedFrame("z"),
        frame(1, 0, topic="kv-events"),
    ]
    outcome = machine.accept(batch, now=0.0)
    assert [e.reason for e in outcome.new_errors] == ["malformed", "truncated"]
    assert machine.malformed == {"malformed": 2, "truncated": 1}
    assert machine.filtered == 1  # a prefix match of another topic
    assert not outcome.envelopes
    assert not machine.accept([MalformedFrame("again")], now=0.0).new_errors


def test_liveness_reports_a_silent_publisher_and_its_return() -> None:
    machine = intake(liveness=3.0)
    machine.accept([frame(7, 0)], now=0.0)
    assert machine.check_liveness(2.0) == []
    (timeout,) = machine.check_liveness(4.0)
    assert isinstance(timeout, EventTimeout)
    assert timeout.publisher_id == 7
    (back,) = machine.accept([frame(7, 1, heartbeat=True)], now=5.0).notices
    assert isinstance(back, PublisherRecovered)
    machine.forget(7)
    assert machine.check_liveness(100.0) == []


def test_a_heartbeat_announces_what_went_missing() -> None:
    machine = intake()
    machine.accept([frame(3, 0)], now=0.0)
    outcome = machine.accept([frame(3, 4, heartbeat=True)], now=1.0)  # the next event will be 4
    assert outcome.notices == [EventGap(3, 1, 3)]
    assert machine.heartbeats == 1


def arrivals_from(steps: list[tuple[int, str]]) -> list[Frame]:
    """Per publisher mostly the next event, now and then a gap, a copy, a restart or a heartbeat."""
    next_sequence: dict[int, int] = {}
    out = []
    for publisher, step in steps:
        n = next_sequence.get(publisher, 0)
        if step == "heartbeat":
            out.append(frame(publisher, n, heartbeat=True))
            continue
        sequence = {"next": n, "gap": n + 2, "copy": max(n - 1, 0), "restart": 0}[step]
        out.append(frame(publisher, sequence))
        next_sequence[publisher] = sequence + 1
    return out


ARRIVALS = st.lists(
    st.tuples(
        st.integers(1, 3),
        st.sampled_from(["next"] * 6 + ["gap", "copy", "restart", "heartbeat"]),
    ),
    max_size=80,
).map(arrivals_from)


@given(ARRIVALS, st.lists(st.integers(1, 20), max_size=6))
def test_a_batch_gives_exactly_what_its_frames_one_by_one_give(
    arrivals: list[Frame], cuts: list[int]
) -> None:
    """Runs of a publisher's next events skip the tracker: any arrival pattern, cut into any batches,
    must deliver and report what accepting each frame alone does (in order, duplicates, gaps,
    restarts, heartbeats, publishers interleaved)."""
    one_by_one, batched = intake(liveness=5.0), intake(liveness=5.0)
    expected_events, expected_notices = [], []
    for f in arrivals:
        outcome = one_by_one.accept([f], now=0.0)
        expected_events += outcome.envelopes
        expected_notices += outcome.notices
    got_events, got_notices, start = [], [], 0
    for cut in [*cuts, len(arrivals)]:
        outcome = batched.accept(arrivals[start : start + cut], now=0.0)
        got_events += outcome.envelopes
        got_notices += outcome.notices
        start += cut
    outcome = batched.accept(arrivals[start:], now=0.0)
    got_events += outcome.envelopes
    got_notices += outcome.notices
    assert got_events == expected_events
    assert got_notices == expected_notices
    assert_same_counters(batched, one_by_one)


@given(
    ARRIVALS,
    st.lists(st.booleans(), min_size=80, max_size=80),
    st.lists(st.integers(1, 20), max_size=6),
    st.sampled_from([1, 2]),
)
def test_bare_envelopes_give_exactly_what_their_frames_give(
    arrivals: list[Frame], bare: list[bool], cuts: list[int], paths: int
) -> None:
    """Transports hand events under the subscriber's own topic over as bare envelopes: whatever mix of
    the two forms arrives, on one path or two, the outcome is the Frames' outcome."""
    framed, mixed = intake(liveness=5.0), intake(liveness=5.0)
    items = [
        f.envelope if bare[i] and f.message_type is MessageType.EVENT else f for i, f in enumerate(arrivals)
    ]
    outcomes: dict[str, tuple[list[EventEnvelope], list[object]]] = {"framed": ([], []), "mixed": ([], [])}
    for name, machine, batch in (("framed", framed, arrivals), ("mixed", mixed, items)):
        events, notices = outcomes[name]
        start = 0
        for cut in [*cuts, len(batch)]:
            outcome = machine.accept(batch[start : start + cut], now=0.0, paths=paths)
            events += outcome.envelopes
            notices += outcome.notices
            start += cut
        outcome = machine.tick(now=10.0, paths=1)  # what waited for a missing event is released
        events += outcome.envelopes
        notices += outcome.notices
    assert outcomes["mixed"] == outcomes["framed"]
    assert_same_counters(mixed, framed)


def test_a_bare_envelope_of_another_topic_is_filtered() -> None:
    machine = intake()
    outcome = machine.accept(
        [EventEnvelope(1, 0, 0, "kv-events", b""), EventEnvelope(1, 0, 0, TOPIC, b"")], 0.0
    )
    assert [e.topic for e in outcome.envelopes] == [TOPIC]
    assert (machine.filtered, machine.received) == (1, 1)


def _run_of(batch: list[EventEnvelope | Frame]) -> tuple[int, int] | None:
    """What a transport vouches for: the batch is one publisher's consecutive bare events."""
    if not batch or not all(isinstance(item, EventEnvelope) for item in batch):
        return None
    first = batch[0]
    assert isinstance(first, EventEnvelope)
    consecutive = all(
        isinstance(e, EventEnvelope)
        and (e.publisher_id, e.sequence) == (first.publisher_id, first.sequence + i)
        for i, e in enumerate(batch)
    )
    return (first.publisher_id, first.sequence) if consecutive else None


@given(ARRIVALS, st.lists(st.integers(1, 20), max_size=6), st.sampled_from([1, 2]), st.booleans())
def test_a_batch_taken_as_a_run_gives_exactly_what_accepting_it_gives(
    arrivals: list[Frame], cuts: list[int], paths: int, silence: bool
) -> None:
    """``accept_run`` delivers a vouched-for batch at once when it continues the publisher's stream, and
    otherwise as ``accept`` does: cut into any batches, on one path or two, after a silence long enough
    to time a publisher out or not, both give the same events, notices and counters."""
    plain, runs = intake(liveness=5.0), intake(liveness=5.0)
    items = [f.envelope if f.message_type is MessageType.EVENT else f for f in arrivals]
    outcomes: dict[str, tuple[list[EventEnvelope], list[object]]] = {"plain": ([], []), "runs": ([], [])}
    for name, machine in (("plain", plain), ("runs", runs)):
        events, notices = outcomes[name]
        start, now = 0, 0.0
        for cut in [*cuts, len(items)]:
            batch = items[start : start + cut]
            start += cut
            if silence:
                now += 6.0
                notices += machine.check_liveness(now)
            run = _run_of(batch) if name == "runs" else None
            if run is not None:
                outcome = machine.accept_run(cast(list[EventEnvelope], batch), *run, now, paths)
            else:
                outcome = machine.accept(batch, now, paths)
            events += outcome.envelopes
            notices += outcome.notices
        outcome = machine.tick(now=now + 10.0, paths=1)
        events += outcome.envelopes
        notices += outcome.notices
    assert outcomes["runs"] == outcomes["plain"]
    assert_same_counters(runs, plain)


def test_a_run_that_continues_the_stream_is_delivered_as_it_came() -> None:
    machine = intake(liveness=5.0)
    first = [EventEnvelope(7, s, 0, TOPIC, b"") for s in range(3)]
    machine.accept_run(first, 7, 0, now=0.0)
    batch = [EventEnvelope(7, s, 0, TOPIC, b"") for s in range(3, 6)]
    outcome = machine.accept_run(batch, 7, 3, now=0.0)
    assert outcome.envelopes is batch  # no copy, no walk
    assert machine.received == 6
    assert machine.tracker.continues(7, 6)
