"""Per-publisher counters of one subscriber, bounded: what metrics label by publisher."""

from __future__ import annotations

from enum import IntEnum

#: The row of the publishers past the bound and of those that left.
OTHER = -1


class Count(IntEnum):
    EVENTS = 0
    GAPS = 1
    MISSING = 2
    DUPLICATES = 3


class PublisherTally:
    """Counts per publisher id for at most ``capacity`` publishers; the rest, and the publishers that
    left (folded in when they go), are counted under :data:`OTHER`, so totals never go down."""

    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = max(1, capacity)
        self.rows: dict[int, list[int]] = {}

    def add(self, publisher_id: int, count: Count, n: int = 1) -> None:
        row = self.rows.get(publisher_id)
        if row is None:
            if len(self.rows) >= self.capacity:
                publisher_id = OTHER
            row = self.rows.setdefault(publisher_id, [0] * len(Count))
        row[count] += n

    def fold(self, publisher_id: int) -> None:
        """``publisher_id`` left: its counts move to :data:`OTHER` (its own row is freed)."""
        row = self.rows.pop(publisher_id, None) if publisher_id != OTHER else None
        if row is not None:
            other = self.rows.setdefault(OTHER, [0] * len(Count))
            for i, value in enumerate(row):
                other[i] += value

    def top(self, n: int) -> list[tuple[int, list[int]]]:
        """The ``n`` publishers with the most events, then :data:`OTHER` holding everyone else's sums."""
        rows = list(self.rows.items())  # one step: metrics read it from another thread
        ranked = sorted(((p, list(r)) for p, r in rows if p != OTHER), key=lambda pr: -pr[1][0])
        kept, rest = ranked[: max(0, n)], ranked[max(0, n) :]
        other = list(self.rows.get(OTHER, [0] * len(Count)))
        for _, row in rest:
            for i, value in enumerate(row):
                other[i] += value
        return [*kept, (OTHER, other)] if any(other) else kept
