"""Where readers that keep their own position are: a read-only view for lag. Pure; bounded.

A Spark query's checkpoint is its position (Kafka's connector never tells Kafka where a query is).
meshplane's source records the offsets each micro-batch committed here, so ``GET
/topics/{t}/readers``, ``/metrics`` and the dashboard show a query's lag beside the consumer groups.
Nothing is moved, held or fenced for a reader: it is a note of where it says it is, the least
recently updated forgotten first when there are too many.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

MAX_READERS = 1000  # views kept on one server, over all topics


@dataclass(frozen=True)
class ReaderView:
    topic: str
    name: str
    offsets: Mapping[int, int]  # partition -> the next offset the reader reads
    updated_at: float


class Readers:
    def __init__(self, capacity: int = MAX_READERS) -> None:
        self.capacity = capacity
        self.forgotten = 0  # views dropped to stay within capacity
        # Events readers moved past, as they said: Spark reads records in bulk (or straight from the
        # segment files on this host), so its reads are counted where it says how far it got.
        self.events_read = 0
        self._views: OrderedDict[tuple[str, str], ReaderView] = OrderedDict()

    def record(
        self, topic: str, name: str, offsets: Mapping[int, int], now: float, ends: Sequence[int] = ()
    ) -> None:
        """``ends``: each partition's next offset, so that no reader counts more than was written."""
        key = (topic, name)
        before = self._views.pop(key, None)
        if before is not None:
            for p, offset in offsets.items():
                end = ends[p] if p < len(ends) else offset
                if p in before.offsets:
                    self.events_read += max(0, min(offset, end) - min(before.offsets[p], end))
        self._views[key] = ReaderView(topic, name, dict(offsets), now)
        while len(self._views) > self.capacity:
            self._views.popitem(last=False)
            self.forgotten += 1

    def of_topic(self, topic: str) -> list[ReaderView]:
        return sorted((v for v in self._views.values() if v.topic == topic), key=lambda v: v.name)

    def __iter__(self) -> Iterator[ReaderView]:
        return iter(list(self._views.values()))

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._views if k[0] == topic]:
            del self._views[key]


class PartitionBounds(Protocol):
    start_offset: int
    next_offset: int


def reader_lag(view: ReaderView, partitions: Sequence[PartitionBounds]) -> dict[int, int]:
    """partition -> events the reader has still to read, given the topic's partitions; one it has not
    recorded counts from its start (where a new partition is read from)."""
    return {
        p: max(0, log.next_offset - view.offsets.get(p, log.start_offset)) for p, log in enumerate(partitions)
    }
