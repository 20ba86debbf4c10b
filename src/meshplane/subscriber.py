"""``EventSubscriber``: every event of one topic in one scope, from every publisher, now and later."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from meshplane.aio import cancel_and_wait
from meshplane.core.envelope import EventEnvelope
from meshplane.core.heads import JoinedLate, PublisherLeft
from meshplane.core.intake import Intake, Notice, Outcome
from meshplane.core.liveness import EventTimeout, LivenessTracker, PublisherRecovered
from meshplane.core.names import Scope
from meshplane.core.records import EventChannel, new_instance_id
from meshplane.discovery.base import Discovery
from meshplane.discovery.channels import ChannelAdded, ChannelWatch, parse_channel
from meshplane.errors import ClosedError, DiscoveryError, MeshplaneError
from meshplane.membership import Membership, PlaneMember
from meshplane.transports.base import Received, SubscriberTransport

if TYPE_CHECKING:
    from meshplane.plane import EventPlane

log = logging.getLogger(__name__)

__all__ = ["EventSubscriber", "Notice", "SubscriberStats"]


@dataclass
class SubscriberStats:
    """What a subscriber has seen. ``malformed`` counts dropped messages by reason."""

    received: int = 0
    filtered: int = 0  # right prefix, wrong topic (ZeroMQ prefix matching) or not an event
    malformed: Counter[str] = field(default_factory=Counter)
    gaps: int = 0
    missing: int = 0
    duplicates: int = 0  # copies of an already delivered sequence (or given up on as missing), dropped
    reordered: int = 0  # events that overtook an earlier one (on another broker) and waited for it
    heartbeats: int = 0
    timeouts: int = 0
    recoveries: int = 0
    duplicates_dropped: int = 0  # copies removed before delivery (one per extra broker)
    publishers_discovered: int = 0
    publishers_heard: int = 0  # publishers that sent an event or heartbeat and have not left or timed out
    invalid_records: int = 0
    dropped_slow: int = 0  # dropped before the subscriber saw them, all reasons (``drops`` says which)
    drops: Counter[str] = field(default_factory=Counter)  # by reason: slow_consumer, queue_full
    joined_late: int = 0  # events publishers sent before this subscriber joined (not lost: not in gaps)
    publishers_left: int = 0  # publishers that said goodbye (closed cleanly)
    after_leave: int = 0  # copies that came after their publisher's goodbye (other brokers), dropped
    goodbyes_contradicted: int = 0  # goodbyes whose publisher went on (not its own: followed again)

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())


class EventSubscriber(PlaneMember):
    """Receives ``topic`` in ``scope``: ``async for envelope in subscriber``.

    Publishers are found through discovery, at creation and whenever they come and go; ZeroMQ
    connects to each one and disconnects when its record is removed. Malformed messages are counted
    in :attr:`stats` and logged, never raised into the iteration.
    """

    def __init__(
        self, scope: Scope, topic: str, transport: SubscriberTransport, membership: Membership
    ) -> None:
        super().__init__(membership)
        self.scope = scope
        self.topic = topic
        self._transport = transport
        self._buffer: deque[EventEnvelope] = deque()
        config = membership.config
        # The arrival pipeline (filter, liveness, reorder, sequence) is pure: this class only drives it.
        self._intake = Intake(
            topic,
            {topic.encode(), scope.subject(topic).encode()},
            liveness_timeout=config.liveness_timeout if config.heartbeat_period else None,
            reorder_window=config.reorder_window,
            subscribed_at=time.monotonic(),
        )
        self._liveness_task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[Notice], None]] = []
        #: The latest notices, for those who look rather than listen.
        self.recent_notices: deque[Notice] = deque(maxlen=1000)
        self._stats = SubscriberStats()
        self._watch: ChannelWatch | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._announced: tuple[Discovery, str] | None = None
        self._closed = False

    @classmethod
    def _made_by(cls, plane: EventPlane) -> Callable[..., Awaitable[EventSubscriber]]:
        return plane.subscriber

    async def _start(self) -> None:
        """Find the publishers and start watching them (the plane calls this once, after opening it);
        connected to every publisher discovery knows when this returns."""
        await self._start_discovery()
        if self._intake.liveness is not None:
            self._liveness_task = asyncio.create_task(
                self._watch_liveness(self._intake.liveness, self.config.heartbeat_period),
                name=f"meshplane-liveness-{self.topic}",
            )

    async def _announce(self) -> None:
        """Register this subscriber, so that publishers can wait for it (NATS)."""
        try:
            discovery = await self._membership.discovery()
            key = f"{self.scope.subscriber_prefix(self.topic)}{new_instance_id():x}"
            await discovery.register(
                key, json.dumps({"type": "EventSubscriber", "topic": self.topic}).encode()
            )
        except DiscoveryError as exc:
            log.warning("subscriber of %s/%s cannot announce itself: %s", self.scope, self.topic, exc)
            return
        self._announced = (discovery, key)

    async def _start_discovery(self) -> None:
        if self._transport.announces:
            await self._announce()
        if self._transport.publisher_discovery == "none":
            return  # broker mode: publishers are behind the brokers, not in discovery
        prefix = self.scope.channel_prefix(self.topic)
        try:
            discovery = await self._membership.discovery()
            initial = await discovery.list(prefix)
        except DiscoveryError as exc:
            if self._transport.publisher_discovery == "required":
                raise
            # The transport delivers by subject; discovery would only tell us who is publishing.
            log.warning("subscriber of %s/%s runs without discovery: %s", self.scope, self.topic, exc)
            return
        self._watch = ChannelWatch(discovery, prefix)
        for channel in self._watch.seed(initial):
            self._transport.add_publisher(channel)
        self._watch_task = asyncio.create_task(
            self._follow(self._watch), name=f"meshplane-watch-{self.topic}"
        )

    async def _follow(self, watch: ChannelWatch) -> None:
        while True:
            try:
                async for event in watch.events():
                    if isinstance(event, ChannelAdded):
                        log.info(
                            "publisher %x of %s/%s discovered",
                            event.channel.instance_id,
                            self.scope,
                            self.topic,
                        )
                        self._transport.add_publisher(event.channel)
                    else:
                        log.info(
                            "publisher %x of %s/%s left", event.channel.instance_id, self.scope, self.topic
                        )
                        # Its connection lingers until its goodbye or a second (ZeroMQ); its sequence is
                        # forgotten then, or when liveness finds it silent: its tail is still judged.
                        self._transport.remove_publisher(event.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("discovery watch of %s/%s failed; restarting it", self.scope, self.topic)
                await asyncio.sleep(0.5)

    @property
    def uses_discovery(self) -> bool:
        """Whether publishers are followed in discovery (not in broker mode, nor without discovery)."""
        return self._watch is not None

    @property
    def publishers(self) -> dict[str, EventChannel]:
        """Publishers currently registered in discovery for this topic, by key."""
        return dict(self._watch.channels) if self._watch is not None else {}

    @property
    def stats(self) -> SubscriberStats:
        s, intake = self._stats, self._intake
        s.received, s.filtered, s.heartbeats = intake.received, intake.filtered, intake.heartbeats
        s.malformed = intake.malformed
        s.gaps, s.missing, s.duplicates = (
            intake.tracker.gaps,
            intake.tracker.missing,
            intake.tracker.duplicates,
        )
        s.publishers_discovered = len(self._watch.channels) if self._watch is not None else 0
        if intake.liveness is not None:
            s.publishers_heard = intake.liveness.tracked - len(intake.liveness.timed_out)
        s.invalid_records = self._watch.invalid if self._watch is not None else 0
        s.drops = Counter(self._transport.drops)
        s.dropped_slow = s.drops.total()
        heads = intake.heads
        s.joined_late = heads.joined_late if heads is not None else 0
        s.publishers_left, s.after_leave = intake.left, intake.after_leave
        s.goodbyes_contradicted = intake.goodbyes_contradicted
        s.duplicates_dropped = self._transport.duplicates_dropped
        s.reordered = intake.reorderer.reordered
        if intake.liveness is not None:
            s.timeouts, s.recoveries = intake.liveness.timeouts, intake.liveness.recoveries
        return s

    def _accept(self, batch: list[Received]) -> None:
        run = self._transport.batch_run
        if run is not None:
            envelopes = cast(list[EventEnvelope], batch)  # the transport vouches for every item
            outcome = self._intake.accept_run(envelopes, *run, time.monotonic(), self._transport.paths)
        else:
            outcome = self._intake.accept(batch, time.monotonic(), self._transport.paths)
        self._buffer.extend(outcome.envelopes)
        if outcome.notices or outcome.new_errors:
            self._report(outcome)

    def _report(self, outcome: Outcome) -> None:
        for error in outcome.new_errors:  # once per reason: a flood must not flood the log
            log.warning(
                "dropping malformed message on %s/%s: %s (counted in stats.malformed)",
                self.scope,
                self.topic,
                error,
            )
        for notice in outcome.notices:
            self._notify(notice)

    async def _receive(self) -> list[Received]:
        """The transport's next batch; an empty one when held events are due for release first."""
        deadline = self._intake.deadline
        if deadline is None:
            return await self._transport.receive()
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await self._transport.receive()
        except TimeoutError:
            return []

    def on_notice(self, listener: Callable[[Notice], None]) -> None:
        """Call ``listener`` with every :data:`Notice` (timeouts, recoveries, gaps) from now on."""
        self._listeners.append(listener)

    def remove_notice_listener(self, listener: Callable[[Notice], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def publisher_counts(self, top: int) -> list[tuple[int, list[int]]]:
        """Events, gaps, missing and duplicates of the ``top`` publishers with the most events, then
        everyone else's summed under id -1 (:class:`meshplane.core.tally.Count` orders a row)."""
        return self._intake.tally.top(top)

    def _notify(self, notice: Notice) -> None:
        self.recent_notices.append(notice)
        if isinstance(notice, PublisherLeft):
            log.info(
                "publisher %x of %s/%s left after event %d",
                notice.publisher_id,
                self.scope,
                self.topic,
                notice.next_sequence - 1,
            )
            self._transport.publisher_left(notice.publisher_id)  # nothing more comes from it
        elif isinstance(notice, JoinedLate):
            log.info(
                "publisher %x of %s/%s began before this subscriber: its events 0..%d were not for it",
                notice.publisher_id,
                self.scope,
                self.topic,
                notice.first_sequence - 1,
            )
        elif isinstance(notice, EventTimeout):
            log.warning(
                "publisher %x of %s/%s silent for %.1fs: timed out",
                notice.publisher_id,
                self.scope,
                self.topic,
                notice.silent_for,
            )
        elif isinstance(notice, PublisherRecovered):
            log.info(
                "publisher %x of %s/%s is back after %.1fs",
                notice.publisher_id,
                self.scope,
                self.topic,
                notice.silent_for,
            )
        else:
            log.info(
                "publisher %x of %s/%s: events %d..%d missing",
                notice.publisher_id,
                self.scope,
                self.topic,
                notice.missing_from,
                notice.missing_to,
            )
        for listener in list(self._listeners):
            try:
                listener(notice)
            except Exception:
                log.exception("notice listener of %s/%s failed", self.scope, self.topic)

    async def _watch_liveness(self, liveness: LivenessTracker, period: float) -> None:
        """Report publishers that stopped talking, and keep reconnecting to them until they are back."""
        reconnected_at: dict[int, float] = {}
        taken = -1
        while True:
            await asyncio.sleep(period / 2)
            # Silence is judged on what the application takes. One that took nothing since the last look
            # while messages wait is behind (publishers' events and heartbeats are among them): a timeout
            # now would be its own, and the reconnection would drop what the socket holds.
            taken, taken_before = self._intake.received + self._intake.heartbeats, taken
            if taken == taken_before and self._transport.unread():
                continue
            now = time.monotonic()
            for publisher_id in await self._left_cleanly(liveness.silent(now)):
                log.info(
                    "publisher %x of %s/%s left (its record is gone)", publisher_id, self.scope, self.topic
                )
                self._intake.forget(publisher_id)
            for notice in liveness.check(now):
                self._notify(notice)
                self._transport.reconnect_publisher(notice.publisher_id)
                reconnected_at[notice.publisher_id] = now
            for publisher_id, at in list(reconnected_at.items()):
                if not liveness.is_timed_out(publisher_id):
                    del reconnected_at[publisher_id]
                elif now - at > liveness.timeout:
                    self._transport.reconnect_publisher(publisher_id)
                    reconnected_at[publisher_id] = now

    async def _left_cleanly(self, silent: list[int]) -> list[int]:
        """Which of the ``silent`` publishers closed cleanly: their discovery record is gone. A
        short-lived publisher can come and go between two looks of the watch; one that died keeps its
        record (until its lease or TTL ends) and is reported as timed out."""
        if not silent or self._watch is None:
            return []
        try:
            records = await (await self._membership.discovery()).list(self.scope.channel_prefix(self.topic))
        except DiscoveryError:
            return []  # cannot tell: report the silence
        registered = set()
        for key, value in records.items():
            with contextlib.suppress(MeshplaneError):
                registered.add(parse_channel(key, value).instance_id)
        return [publisher_id for publisher_id in silent if publisher_id not in registered]

    def __aiter__(self) -> EventSubscriber:
        return self

    async def __anext__(self) -> EventEnvelope:
        buffer = self._buffer
        if not buffer:  # what has arrived goes out without another coroutine
            await self._fill()
        return buffer.popleft()

    async def batches(
        self, max_events: int = 4096, max_wait: float = 0.0
    ) -> AsyncIterator[list[EventEnvelope]]:
        """The events in lists of at most ``max_events``: ``async for batch in sub.batches()``.

        A list comes as soon as one event is there; with ``max_wait`` it waits up to that many seconds
        more to fill up. Gaps, duplicates and liveness are tracked as when iterating one by one; the
        iteration ends when the subscriber is closed.
        """
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, not {max_events}")
        buffer = self._buffer
        while True:
            try:
                await self._fill()
            except StopAsyncIteration:
                return
            if max_wait > 0 and len(buffer) < max_events:
                await self._top_up(max_events, max_wait)
            if len(buffer) <= max_events:
                batch = list(buffer)
                buffer.clear()
            else:
                batch = [buffer.popleft() for _ in range(max_events)]
            yield batch

    async def _top_up(self, max_events: int, max_wait: float) -> None:
        """Receive for up to ``max_wait`` seconds more, until ``max_events`` are buffered or it closes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait
        while len(self._buffer) < max_events and not self._closed and (left := deadline - loop.time()) > 0:
            try:
                async with asyncio.timeout(left):
                    batch = await self._receive()
            except TimeoutError:
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed and (task is None or not task.cancelling()):
                    return  # close() cancelled the wait: what is buffered still goes out
                raise
            self._accept(batch)

    async def _fill(self) -> None:
        """Until at least one event is buffered; ``StopAsyncIteration`` once closed."""
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            try:
                batch = await self._receive()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed and (task is None or not task.cancelling()):
                    raise StopAsyncIteration from None  # close() cancelled the wait, not our caller
                raise
            self._accept(batch)

    async def next(self, timeout: float | None = None) -> EventEnvelope:
        """The next event; ``TimeoutError`` after ``timeout`` seconds, ``ClosedError`` once closed."""
        if self._buffer:
            return self._buffer.popleft()  # no timer needed for what has already arrived
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except StopAsyncIteration:
            raise ClosedError(f"subscriber of {self.scope}/{self.topic} is closed") from None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._leave_plane()
        for task in (self._watch_task, self._liveness_task):
            await cancel_and_wait(task)
        if self._announced is not None:
            discovery, key = self._announced
            with contextlib.suppress(DiscoveryError):
                await discovery.unregister(key)
        await self._transport.close()
        await self._close_private_plane()

    def __repr__(self) -> str:
        return f"<EventSubscriber {self.scope}/{self.topic}>"
