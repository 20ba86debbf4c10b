"""Where a publisher's sequence began, as a subscriber sees it: heartbeat news and head losses.

A publisher numbers its events from 0, and its heartbeats carry its age (``uptime_ms``) and, the
last one, that it is leaving (``final``), in a payload Dynamo never reads (docs/wire.md). A subscriber
whose first news of a publisher is sequence ``f > 0`` cannot tell at once whether events ``0..f-1``
were lost on the way or sent before it subscribed; the publisher's age settles it: a publisher that
began after the subscriber lost them (:class:`~meshplane.core.sequence.EventGap`), one that began
before was joined late (:class:`JoinedLate`). Pure and clock-injected: times are the caller's
monotonic seconds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from meshplane.core.sequence import EventGap
from meshplane.errors import MalformedFrame


class HeartbeatNews(msgspec.Struct, omit_defaults=True):
    """A heartbeat's payload: empty from older publishers, a MessagePack map from this version on."""

    uptime_ms: int | None = None  # milliseconds since the publisher began (its own monotonic clock)
    final: bool = False  # the publisher is leaving: its heartbeat's sequence is one past its last event


NO_NEWS = HeartbeatNews()
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(HeartbeatNews).decode


def encode_news(uptime_ms: int, final: bool = False) -> bytes:
    return _encode(HeartbeatNews(max(0, uptime_ms), final))


def decode_news(payload: bytes) -> HeartbeatNews:
    """The news in a heartbeat's payload (unknown keys ignored: later versions may add some)."""
    if not payload:
        return NO_NEWS
    try:
        news = _decode(payload)
    except msgspec.DecodeError as exc:
        raise MalformedFrame(f"heartbeat payload is not meshplane's news: {exc}") from None
    if news.uptime_ms is not None and news.uptime_ms < 0:
        raise MalformedFrame(f"heartbeat uptime_ms {news.uptime_ms} is negative")
    return news


@dataclass(frozen=True, slots=True)
class JoinedLate:
    """``publisher_id`` began before this subscriber: its events before ``first_sequence`` were sent
    before the subscriber was there (not lost)."""

    publisher_id: int
    first_sequence: int


@dataclass(frozen=True, slots=True)
class PublisherLeft:
    """``publisher_id`` closed cleanly; ``next_sequence`` is one past its last event."""

    publisher_id: int
    next_sequence: int


HEADS_REMEMBERED = 10_000
T = TypeVar("T")


class HeadTracker:
    """Publishers first heard of past their sequence 0, and publishers' ages, until both are known.

    Invariant: a publisher is reported at most once, as an :class:`EventGap` from 0 (it began at or
    after ``subscribed_at``) or as :class:`JoinedLate` (it began before), whichever of its first
    sequence and its age comes first. The age is taken when a heartbeat arrives, not when it is
    processed (events waiting for reordering hold it back), and the earliest estimate wins: each is
    late by its trip. At most ``remembered`` publishers wait for either; past that the longest waiting
    is given up (never reported).
    """

    def __init__(self, subscribed_at: float, remembered: int = HEADS_REMEMBERED) -> None:
        self.subscribed_at = subscribed_at
        self._remembered = max(1, remembered)
        self._pending: OrderedDict[int, int] = OrderedDict()  # publisher -> first sequence heard
        self._born: OrderedDict[int, float] = OrderedDict()  # publisher -> when it began, as yet unused
        self.joined_late = 0  # events sent before the subscriber joined (summed over publishers)
        self.given_up = 0

    def first(self, publisher_id: int, sequence: int) -> EventGap | JoinedLate | None:
        """The first news of ``publisher_id`` is ``sequence`` (an event's, or a heartbeat's next)."""
        born = self._born.pop(publisher_id, None)
        if sequence <= 0:
            return None
        if born is not None:
            return self._judge(publisher_id, sequence, born)
        self._remember(self._pending, publisher_id, sequence)
        return None

    def started(self, publisher_id: int, started_at: float) -> EventGap | JoinedLate | None:
        """``publisher_id`` began at ``started_at`` (the subscriber's clock); for a publisher whose first
        news is in, what its head was; else kept for when it is."""
        first = self._pending.pop(publisher_id, None)
        if first is not None:
            return self._judge(publisher_id, first, started_at)
        earlier = self._born.get(publisher_id)
        self._remember(self._born, publisher_id, started_at if earlier is None else min(earlier, started_at))
        return None

    def _judge(self, publisher_id: int, first: int, started_at: float) -> EventGap | JoinedLate:
        if started_at >= self.subscribed_at:
            return EventGap(publisher_id, 0, first - 1)
        self.joined_late += first
        return JoinedLate(publisher_id, first)

    def _remember(self, table: OrderedDict[int, T], publisher_id: int, value: T) -> None:
        table[publisher_id] = value
        if len(table) > self._remembered:
            table.popitem(last=False)
            self.given_up += 1

    def forget(self, publisher_id: int) -> None:
        self._pending.pop(publisher_id, None)
        self._born.pop(publisher_id, None)

    def is_pending(self, publisher_id: int) -> bool:
        """Whether ``publisher_id``'s first news is in and its age is awaited."""
        return publisher_id in self._pending

    @property
    def waiting(self) -> int:
        return len(self._pending) + len(self._born)
