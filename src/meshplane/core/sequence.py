"""Per-publisher sequence tracking: in order, gap (with the missing range), duplicate, new stream."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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


class SequenceTracker:
    """Remembers the highest sequence per publisher id and classifies each arrival."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}
        self.gaps = 0
        self.missing = 0
        self.duplicates = 0

    def observe(self, publisher_id: int, sequence: int) -> Observation:
        last = self._last.get(publisher_id)
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

    def expect(self, publisher_id: int, next_sequence: int) -> Observation:
        """A heartbeat says the publisher's next event will be ``next_sequence``: detects lost tails.

        Stale news (a heartbeat behind what already arrived) changes nothing.
        """
        last = self._last.get(publisher_id)
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

    @property
    def publishers(self) -> int:
        return len(self._last)
