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

MAX_READERS = 10_000  # views kept on one server, over all topics ...
MAX_READERS_PER_TOPIC = 100  # ... and on one topic: junk names on one topic never evict another's
MAX_IDENTITY = 64  # characters of how a reader's name was chosen


@dataclass(frozen=True)
class ReaderView:
    topic: str
    name: str
    offsets: Mapping[int, int]  # partition -> the next offset the reader reads
    updated_at: float
    owner: str = ""  # the writer's token fingerprint ("" without tokens): views are kept per owner
    identity: str = ""  # how the name was chosen (Spark: "queryName", "checkpoint", "readerName")


class Readers:
    """Views by topic, then (owner, name); a token writes only its own views (another token's view of
    the same name is another view), so a read-only token cannot move anyone else's lag."""

    def __init__(self, capacity: int = MAX_READERS, per_topic: int = MAX_READERS_PER_TOPIC) -> None:
        self.capacity, self.per_topic = capacity, per_topic
        self.forgotten = 0  # views dropped to stay within capacity
        # Events readers moved past, as they said: Spark reads records in bulk (or straight from the
        # segment files on this host), so its reads are counted where it says how far it got.
        self.events_read = 0
        self._views: dict[str, OrderedDict[tuple[str, str], ReaderView]] = {}
        self._count = 0

    def record(
        self,
        topic: str,
        name: str,
        offsets: Mapping[int, int],
        now: float,
        owner: str = "",
        identity: str = "",
        ends: Sequence[int] = (),
    ) -> None:
        """``ends``: each partition's next offset, so that no reader counts more than was written."""
        views = self._views.setdefault(topic, OrderedDict())
        before = views.pop((owner, name), None)
        if before is not None:
            self._count -= 1
            for p, offset in offsets.items():
                end = ends[p] if p < len(ends) else offset
                if p in before.offsets:
                    self.events_read += max(0, min(offset, end) - min(before.offsets[p], end))
        views[(owner, name)] = ReaderView(topic, name, dict(offsets), now, owner, identity[:MAX_IDENTITY])
        self._count += 1
        while len(views) > self.per_topic:
            self._forget_oldest(views)
        while self._count > self.capacity:  # from the topic holding the most
            self._forget_oldest(max(self._views.values(), key=len))

    def _forget_oldest(self, views: OrderedDict[tuple[str, str], ReaderView]) -> None:
        views.popitem(last=False)
        self._count -= 1
        self.forgotten += 1

    def of_topic(self, topic: str) -> list[ReaderView]:
        return sorted(self._views.get(topic, {}).values(), key=lambda v: (v.name, v.owner))

    def __iter__(self) -> Iterator[ReaderView]:
        return iter([v for views in self._views.values() for v in views.values()])

    def __len__(self) -> int:
        return self._count

    def forget_topic(self, topic: str) -> None:
        self._count -= len(self._views.pop(topic, {}))


class PartitionBounds(Protocol):
    start_offset: int
    next_offset: int


def reader_lag(view: ReaderView, partitions: Sequence[PartitionBounds]) -> dict[int, int]:
    """partition -> events the reader has still to read, given the topic's partitions; one it has not
    recorded counts from its start (where a new partition is read from)."""
    return {
        p: max(0, log.next_offset - view.offsets.get(p, log.start_offset)) for p, log in enumerate(partitions)
    }
