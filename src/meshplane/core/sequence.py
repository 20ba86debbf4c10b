"""Per-publisher sequences: classify each arrival (in order, gap, duplicate, restart); restore order."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")


class Arrival(Enum):
    FIRST = "first"  # first event seen from this publisher id
    IN_ORDER = "in_order"
    GAP = "gap"  # one or more sequences were skipped
    DUPLICATE = "duplicate"  # at or below the highest sequence seen
    RESTART = "restart"  # sequence went back to 0: the publisher restarted its stream


@dataclass(frozen=True, slots=True)
class Observation:
    arrival: Arrival
    missing_from: int = 0  # first missing sequence, for GAP
    missing_to: int = 0  # last missing sequence (inclusive), for GAP

    @property
    def missing(self) -> int:
        return self.missing_to - self.missing_from + 1 if self.arrival is Arrival.GAP else 0


@dataclass(frozen=True, slots=True)
class EventGap:
    """Events ``missing_from``..``missing_to`` (inclusive) of ``publisher_id`` never arrived."""

    publisher_id: int
    missing_from: int
    missing_to: int

    @property
    def missing(self) -> int:
        return self.missing_to - self.missing_from + 1


_FIRST = Observation(Arrival.FIRST)
_IN_ORDER = Observation(Arrival.IN_ORDER)
_DUPLICATE = Observation(Arrival.DUPLICATE)
_RESTART = Observation(Arrival.RESTART)


PUBLISHERS_REMEMBERED = 100_000


class SequenceTracker:
    """Remembers the highest sequence per publisher id and classifies each arrival.

    Memory stays bounded however many publishers come and go (broker mode never hears that one
    left): publishers live in two generations of up to ``remembered / 2`` each; an arrival from the
    older one moves it up, and when the newer one is full, the older one (publishers not heard from
    for a whole generation) is forgotten. A forgotten publisher that speaks again counts as new.
    """

    def __init__(self, remembered: int = PUBLISHERS_REMEMBERED) -> None:
        self._last: dict[int, int] = {}  # the newer generation: every arrival looks here first
        self._older: dict[int, int] = {}
        self._generation = max(1, remembered // 2)
        self.gaps = 0
        self.missing = 0
        self.duplicates = 0
        self.forgotten = 0

    def _revive(self, publisher_id: int) -> int | None:
        """A publisher missing from the newer generation: moved up from the older, or None if new
        (then room is made for it)."""
        last = self._older.pop(publisher_id, None)
        if last is not None:
            self._last[publisher_id] = last
        elif len(self._last) >= self._generation:
            self.forgotten += len(self._older)
            self._older, self._last = self._last, {}
        return last

    def observe(self, publisher_id: int, sequence: int) -> Observation:
        last = self._last.get(publisher_id)
        if last is None:
            last = self._revive(publisher_id)
        if last is None:
            self._last[publisher_id] = sequence
            return _FIRST
        if sequence == last + 1:
            self._last[publisher_id] = sequence
            return _IN_ORDER
        if sequence > last + 1:
            self._last[publisher_id] = sequence
            self.gaps += 1
            self.missing += sequence - last - 1
            return Observation(Arrival.GAP, last + 1, sequence - 1)
        if sequence == 0:
            self._last[publisher_id] = 0
            return _RESTART
        self.duplicates += 1
        return _DUPLICATE

    def knows(self, publisher_id: int) -> bool:
        """Whether ``publisher_id`` has been heard of (and not forgotten)."""
        return publisher_id in self._last or publisher_id in self._older

    def continues(self, publisher_id: int, sequence: int) -> bool:
        """Whether ``sequence`` is the very next event of a publisher in the newer generation."""
        return self._last.get(publisher_id, -2) == sequence - 1

    def settle(self, publisher_id: int, sequence: int) -> None:
        """``publisher_id``'s events arrived in order up to ``sequence``: what ``observe`` of each, as
        IN_ORDER, would have left. For a publisher just observed (so in the newer generation)."""
        self._last[publisher_id] = sequence

    def expect(self, publisher_id: int, next_sequence: int) -> Observation:
        """A heartbeat says the publisher's next event will be ``next_sequence``: detects lost tails.

        Stale news (a heartbeat behind what already arrived) changes nothing.
        """
        last = self._last.get(publisher_id)
        if last is None:
            last = self._revive(publisher_id)
        if last is None:
            self._last[publisher_id] = next_sequence - 1
            return _FIRST
        if next_sequence - 1 > last:
            self._last[publisher_id] = next_sequence - 1
            self.gaps += 1
            self.missing += next_sequence - 1 - last
            return Observation(Arrival.GAP, last + 1, next_sequence - 1)
        return _IN_ORDER

    def forget(self, publisher_id: int) -> None:
        self._last.pop(publisher_id, None)
        self._older.pop(publisher_id, None)

    @property
    def publishers(self) -> int:
        return len(self._last) + len(self._older)


@dataclass(slots=True)
class _Stream(Generic[T]):
    next: int = 0  # the sequence to release next
    held: dict[int, tuple[T, float]] = field(
        default_factory=dict
    )  # ahead of a missing one, with arrival time
    heartbeat: tuple[int, T, float] | None = None  # the newest heartbeat announcing unreleased events


class Reorderer(Generic[T]):
    """Restores each publisher's sequence order where events travel several paths (one per broker).

    An event behind a missing one is held until the missing one arrives or ``window`` seconds pass;
    then what is held goes out in order, and the :class:`SequenceTracker` downstream sees (and reports)
    the gap. A publisher's first events are held too unless they start at 0: earlier ones may still be
    on a slower path. A heartbeat is released after the events it announces, so that it never reports
    as lost what is merely late. Each publisher holds at most ``max_held`` events; past that, the
    oldest hole is given up at once. Publishers are remembered in two generations, as by the
    :class:`SequenceTracker`; one that holds something is never forgotten.
    """

    def __init__(
        self, window: float, max_held: int = 10_000, remembered: int = PUBLISHERS_REMEMBERED
    ) -> None:
        if window < 0 or max_held < 1:
            raise ValueError(f"window must be >= 0 and max_held >= 1, got {window!r} and {max_held!r}")
        self.window = window
        self.max_held = max_held
        self._streams: dict[int, _Stream[T]] = {}  # the newer generation, and every waiting publisher
        self._older: dict[int, _Stream[T]] = {}
        self._generation = max(1, remembered // 2)
        self._waiting: set[int] = set()  # publishers holding something
        self.reordered = 0  # events that arrived ahead of a missing one and were held

    @property
    def held(self) -> int:
        return sum(len(self._streams[p].held) for p in self._waiting)

    @property
    def publishers(self) -> int:
        return len(self._streams) + len(self._older)

    @property
    def deadline(self) -> float | None:
        """When :meth:`expire` next has something to release (None: nothing is held)."""
        if not self._waiting:
            return None
        return min(self._first_arrival(self._streams[p]) for p in self._waiting) + self.window

    def push(self, publisher_id: int, sequence: int, heartbeat: bool, item: T, now: float) -> list[T]:
        """Take one event (or heartbeat: ``sequence`` is the next event's); return what is now in order."""
        stream = self._streams.get(publisher_id)
        if stream is None:
            stream = self._older.pop(publisher_id, None)
            if stream is None:
                stream = _Stream()
                if len(self._streams) >= self._generation:
                    self._older, self._streams = self._streams, {}
                    for waiting in self._waiting:  # never forget what still waits to be released
                        self._streams[waiting] = self._older.pop(waiting)
            self._streams[publisher_id] = stream
        if heartbeat:
            if sequence <= stream.next:
                return [item]
            if stream.heartbeat is None or sequence > stream.heartbeat[0]:
                since = now if stream.heartbeat is None else stream.heartbeat[2]
                stream.heartbeat = (sequence, item, since)
            self._waiting.add(publisher_id)
            return []
        if sequence < stream.next:
            if sequence != 0:
                return [item]  # a duplicate: the tracker counts and drops it
            # The publisher restarted its stream: what the old one left behind goes first.
            released = self._release(publisher_id, stream, now, everything=True)
            stream.next = 1
            return [*released, item]
        if sequence > stream.next:
            if sequence not in stream.held:
                stream.held[sequence] = (item, now)
                self.reordered += 1
            self._waiting.add(publisher_id)
            if len(stream.held) > self.max_held:
                return self._release(publisher_id, stream, now, give_up_first_hole=True)
            return []
        stream.next += 1
        if publisher_id not in self._waiting:
            return [item]
        return [item, *self._release(publisher_id, stream, now)]

    def expire(self, now: float) -> list[T]:
        """Release what has waited ``window`` seconds for a missing event, in order."""
        out: list[T] = []
        for publisher_id in [
            p for p in self._waiting if self._first_arrival(self._streams[p]) + self.window <= now
        ]:
            out.extend(self._release(publisher_id, self._streams[publisher_id], now))
        return out

    def _release(
        self,
        publisher_id: int,
        stream: _Stream[T],
        now: float,
        everything: bool = False,
        give_up_first_hole: bool = False,
    ) -> list[T]:
        """Release, in order, what is contiguous with ``next``, and everything up to what waited too long."""
        held = stream.held
        window = self.window
        cut = stream.next - 1  # release every held sequence up to here, skipping the holes
        if everything:
            cut = max(held, default=cut)
        else:
            for sequence, (_, arrived) in held.items():  # in arrival order
                if arrived + window > now:  # the same sum as the deadline: no rounding gap between them
                    break
                cut = max(cut, sequence)
            if give_up_first_hole:
                cut = max(cut, min(held))
        beat = stream.heartbeat
        if beat is not None and (everything or beat[2] + window <= now):
            cut = max(cut, beat[0] - 1)
        out: list[T] = []
        if cut >= stream.next:
            for sequence in sorted(s for s in held if s <= cut):
                out.append(held.pop(sequence)[0])
            stream.next = cut + 1
        while stream.next in held:
            out.append(held.pop(stream.next)[0])
            stream.next += 1
        if beat is not None and beat[0] <= stream.next:
            out.append(beat[1])
            stream.heartbeat = None
        if not held and stream.heartbeat is None:
            self._waiting.discard(publisher_id)
        return out

    @staticmethod
    def _first_arrival(stream: _Stream[T]) -> float:
        times = [next(iter(stream.held.values()))[1]] if stream.held else []
        if stream.heartbeat is not None:
            times.append(stream.heartbeat[2])
        return min(times)
