"""A subscriber's arrival pipeline as a pure state machine: filter, liveness, reorder, sequence, notices.

:meth:`Intake.accept` takes what a transport received (decoded frames, or the :class:`WireError` of
what could not be decoded) at a time ``now`` and answers the envelopes to deliver, in order, and the
notices to report; :meth:`Intake.tick` releases what waited for a missing event once its window is
over (:attr:`Intake.deadline` says when). No clock, no I/O: the asyncio subscriber only drives it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from meshplane.core.envelope import EventEnvelope
from meshplane.core.framing import Frame, MessageType
from meshplane.core.heads import HeadTracker, JoinedLate, PublisherLeft, decode_news
from meshplane.core.liveness import EventTimeout, LivenessTracker, PublisherRecovered
from meshplane.core.sequence import Arrival, EventGap, Reorderer, SequenceTracker
from meshplane.core.tally import Count, PublisherTally
from meshplane.errors import WireError

_EVENT = MessageType.EVENT

#: What a subscriber reports besides events: a publisher timed out, came back or left, events went
#: missing, or were sent before the subscriber joined.
Notice = EventTimeout | PublisherRecovered | EventGap | JoinedLate | PublisherLeft
LEFT_REMEMBERED = 10_000


@dataclass
class Outcome:
    """What one step of the intake produced."""

    envelopes: list[EventEnvelope] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    new_errors: list[WireError] = field(default_factory=list)  # the first of each reason, to log once


class Intake:
    """Arrivals of one topic from every publisher: each event delivered once, in each publisher's order.

    ``paths`` (given with each step) is how many routes an event can take (brokers); above 1, events
    that overtook a missing one wait for it up to ``reorder_window`` seconds. ``subscribed_at`` (the
    clock of ``now``) is when the subscriber began: a publisher first heard of past its sequence 0 is
    reported, once its heartbeat tells its age, as a gap from 0 if it began later, else as
    :class:`JoinedLate` (None: heads are not judged). A publisher's final heartbeat reports its lost
    tail, then :class:`PublisherLeft`; copies arriving after it (other brokers) are dropped.
    """

    def __init__(
        self,
        topic: str,
        routing_topics: Iterable[bytes],
        *,
        liveness_timeout: float | None,
        reorder_window: float,
        subscribed_at: float | None = None,
    ) -> None:
        self.topic = topic
        self.routing_topics = frozenset(routing_topics)
        self.tracker = SequenceTracker()
        self.reorderer: Reorderer[EventEnvelope | Frame] = Reorderer(reorder_window)
        self.liveness = LivenessTracker(liveness_timeout) if liveness_timeout else None
        self.heads = HeadTracker(subscribed_at) if subscribed_at is not None else None
        self.tally = PublisherTally()
        # Publishers that said goodbye, newest last, with the sequence their goodbye said came next.
        self._left: OrderedDict[int, int] = OrderedDict()
        self.left = 0
        self.after_leave = 0  # copies of events or heartbeats that came after their publisher's goodbye
        self.goodbyes_contradicted = 0  # a goodbye's publisher went on (the goodbye was not its own)
        self.received = 0
        self.filtered = 0  # right prefix, wrong topic (ZeroMQ prefix matching)
        self.heartbeats = 0
        self.malformed: Counter[str] = Counter()

    @property
    def deadline(self) -> float | None:
        """When events held for a missing one must be released (:meth:`tick`), if any are held."""
        return self.reorderer.deadline

    def accept(
        self, batch: Iterable[EventEnvelope | Frame | WireError], now: float, paths: int = 1
    ) -> Outcome:
        """Take a transport's batch: Frames, the WireError of what could not be decoded, and bare
        envelopes, which are events whose routing topic the transport already checked (its own)."""
        out = Outcome()
        admitted: list[EventEnvelope | Frame] = []  # events bare, heartbeats as Frames
        append = admitted.append
        liveness = self.liveness
        topic = self.topic
        left = self._left
        last_alive = None
        gone = False
        for item in batch:
            if isinstance(item, EventEnvelope):
                envelope = item
                if envelope.topic != topic:
                    self.filtered += 1
                    continue
            elif isinstance(item, WireError):
                if not self.malformed[item.reason]:
                    out.new_errors.append(item)
                self.malformed[item.reason] += 1
                continue
            else:
                envelope = item.envelope
                if envelope.topic != topic or item.routing_topic not in self.routing_topics:
                    self.filtered += 1
                    continue
                if item.message_type is _EVENT:
                    item = envelope
            if envelope.publisher_id != last_alive:
                # once per run of one publisher: the batch shares its `now`
                last_alive = envelope.publisher_id
                gone = bool(left) and last_alive in left
                if liveness is not None and not gone:
                    recovered = liveness.seen(last_alive, now)
                    if recovered is not None:
                        out.notices.append(recovered)
            if gone and item is not envelope:  # a heartbeat after the goodbye: a copy of it, or stale
                self.after_leave += 1
                continue
            if item is not envelope and envelope.payload and not self._aged(envelope, now, out):
                continue  # a heartbeat whose news is malformed: counted, dropped
            append(item)
        if paths > 1 or self.reorderer.deadline is not None:
            admitted = self._reorder(admitted, now, paths)
        self._sequence(admitted, out, now)
        return out

    def accept_run(
        self, envelopes: list[EventEnvelope], publisher_id: int, first: int, now: float, paths: int = 1
    ) -> Outcome:
        """Take a batch the transport vouches for: ``envelopes`` are, in full, events of this topic that
        ``publisher_id`` sent with consecutive sequences from ``first``. When that continues what was
        delivered (and nothing waits for reordering), the batch is delivered as it is, in O(1);
        otherwise it goes through :meth:`accept` event by event."""
        tracker = self.tracker
        if (
            paths > 1
            or self.reorderer.deadline is not None
            or not tracker.continues(publisher_id, first)
            or publisher_id in self._left
        ):
            return self.accept(envelopes, now, paths)
        out = Outcome(envelopes)
        if self.liveness is not None and (recovered := self.liveness.seen(publisher_id, now)) is not None:
            out.notices.append(recovered)
        self.received += len(envelopes)
        tracker.settle(publisher_id, first + len(envelopes) - 1)
        self.tally.add(publisher_id, Count.EVENTS, len(envelopes))
        return out

    def tick(self, now: float, paths: int = 1) -> Outcome:
        """Release what waited past its window (or, with one path left, everything that waits)."""
        return self.accept((), now, paths)

    def check_liveness(self, now: float) -> list[EventTimeout]:
        return self.liveness.check(now) if self.liveness is not None else []

    def forget(self, publisher_id: int) -> None:
        """A publisher left (its record is gone): its sequence and signs of life are no longer expected."""
        self.tracker.forget(publisher_id)
        self.tally.fold(publisher_id)
        if self.liveness is not None:
            self.liveness.forget(publisher_id)
        if self.heads is not None:
            self.heads.forget(publisher_id)

    def _reorder(
        self, admitted: list[EventEnvelope | Frame], now: float, paths: int
    ) -> list[EventEnvelope | Frame]:
        reorderer = self.reorderer
        out: list[EventEnvelope | Frame] = []
        for item in admitted:
            if isinstance(item, EventEnvelope):
                out.extend(reorderer.push(item.publisher_id, item.sequence, False, item, now))
            else:
                envelope = item.envelope
                out.extend(reorderer.push(envelope.publisher_id, envelope.sequence, True, item, now))
        deadline = reorderer.deadline
        if deadline is not None and (deadline <= now or paths <= 1):
            # Waited long enough (or the other paths are gone): a missing event is lost, not late.
            out.extend(reorderer.expire(now if paths > 1 else float("inf")))
        return out

    def _sequence(self, admitted: list[EventEnvelope | Frame], out: Outcome, now: float) -> None:
        tracker, tally, heads, left = self.tracker, self.tally, self.heads, self._left
        delivered = out.envelopes
        # Most of a batch is runs of one publisher's next events: those skip the tracker, which
        # learns where a run ended before it sees anything else.
        run_publisher = run_start = run_next = -1
        for item in admitted:
            if isinstance(item, EventEnvelope):
                if item.sequence == run_next and item.publisher_id == run_publisher:
                    run_next += 1
                    delivered.append(item)
                    continue
                if run_publisher != -1:
                    self.received += run_next - run_start
                    tracker.settle(run_publisher, run_next - 1)
                    tally.add(run_publisher, Count.EVENTS, run_next - run_start)
                    run_publisher = -1
                if left and item.publisher_id in left and not self._still_talking(item, now, out):
                    self.after_leave += 1  # a copy of what it sent before its goodbye
                    continue
                observation = tracker.observe(item.publisher_id, item.sequence)
                if observation.arrival is not Arrival.DUPLICATE:  # a duplicate is counted by the tracker
                    delivered.append(item)
                    run_publisher, run_start = item.publisher_id, item.sequence
                    run_next = run_start + 1
                else:
                    tally.add(item.publisher_id, Count.DUPLICATES)
                envelope = item
            else:
                if run_publisher != -1:
                    self.received += run_next - run_start
                    tracker.settle(run_publisher, run_next - 1)
                    tally.add(run_publisher, Count.EVENTS, run_next - run_start)
                    run_publisher = -1
                envelope = item.envelope
                if left and envelope.publisher_id in left:
                    self.after_leave += 1
                    continue
                self.heartbeats += 1
                observation = tracker.expect(envelope.publisher_id, envelope.sequence)
            if observation.arrival is Arrival.GAP:
                gap = EventGap(envelope.publisher_id, observation.missing_from, observation.missing_to)
                self._gap(out, gap)
            elif observation.arrival is Arrival.FIRST and heads is not None:
                self._head(heads.first(envelope.publisher_id, envelope.sequence), out)
            if not isinstance(item, EventEnvelope) and item.envelope.payload:
                self._heard(envelope, out)
        if run_publisher != -1:
            self.received += run_next - run_start
            tracker.settle(run_publisher, run_next - 1)
            tally.add(run_publisher, Count.EVENTS, run_next - run_start)

    def _gap(self, out: Outcome, gap: EventGap) -> None:
        out.notices.append(gap)
        self.tally.add(gap.publisher_id, Count.GAPS)
        self.tally.add(gap.publisher_id, Count.MISSING, gap.missing)

    def _head(self, head: EventGap | JoinedLate | None, out: Outcome) -> None:
        if isinstance(head, EventGap):
            self.tracker.gaps += 1
            self.tracker.missing += head.missing
            self._gap(out, head)
        elif head is not None:
            out.notices.append(head)

    def _aged(self, heartbeat: EventEnvelope, now: float, out: Outcome) -> bool:
        """A heartbeat's news as it arrives (False: malformed). Its age is taken now: a heartbeat
        processed later (behind events held for reordering) would make its publisher look younger."""
        try:
            news = decode_news(heartbeat.payload)
        except WireError as exc:
            if not self.malformed[exc.reason]:
                out.new_errors.append(exc)
            self.malformed[exc.reason] += 1
            return False
        heads = self.heads
        if news.uptime_ms is not None and heads is not None:
            publisher_id = heartbeat.publisher_id
            if not self.tracker.knows(publisher_id) or heads.is_pending(publisher_id):
                self._head(heads.started(publisher_id, now - news.uptime_ms / 1000), out)
        return True

    def _heard(self, heartbeat: EventEnvelope, out: Outcome) -> None:
        """A final heartbeat, in its place after the events: the publisher left. Its sequence is kept
        (the tracker's too): what comes later below it is a copy, at or above it a publisher still
        talking (nothing binds a goodbye to its sender: a third party's must not silence anyone)."""
        if decode_news(heartbeat.payload).final:  # checked on arrival (_aged)
            publisher_id = heartbeat.publisher_id
            out.notices.append(PublisherLeft(publisher_id, heartbeat.sequence))
            self.tally.fold(publisher_id)
            if self.liveness is not None:
                self.liveness.forget(publisher_id)
            if self.heads is not None:
                self.heads.forget(publisher_id)
            self.left += 1
            self._left[publisher_id] = heartbeat.sequence
            if len(self._left) > LEFT_REMEMBERED:
                self._left.popitem(last=False)

    def _still_talking(self, event: EventEnvelope, now: float, out: Outcome) -> bool:
        """An event of a publisher that said goodbye: a copy of one sent before it (False), or one
        sent after it (True): the goodbye was not its publisher's, which is followed again."""
        publisher_id = event.publisher_id
        if event.sequence < self._left[publisher_id]:
            return False
        del self._left[publisher_id]
        self.goodbyes_contradicted += 1
        if self.liveness is not None and (recovered := self.liveness.seen(publisher_id, now)) is not None:
            out.notices.append(recovered)
        return True
