"""Partitioned topics: one log per partition, key routing, reads checked against retention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from meshplane.core.streamlog import RetentionPolicy, partition_for_key
from meshplane.streams.errors import BadRequest, NotFound, OffsetOutOfRange
from meshplane.streams.events import Notifier, StreamEvent, decode_stream_event
from meshplane.streams.files import FilePool
from meshplane.streams.log import PartitionLog, Segment


class TopicSettings(msgspec.Struct):
    num_partitions: int
    replication_factor: int = 1
    retention: RetentionPolicy = msgspec.field(default_factory=RetentionPolicy)
    segment_bytes: int = 64 * 1024 * 1024
    created_at: float = 0.0
    # Which life of the name this is: a topic deleted and created again is another incarnation, and
    # nothing of the old one (idempotency answers) applies to it.
    incarnation: str = ""


class Topic:
    def __init__(
        self, name: str, directory: Path, settings: TopicSettings, files: FilePool | None = None
    ) -> None:
        self.name = name
        self.directory = directory
        self.settings = settings
        self.files = files
        self.partitions: list[PartitionLog] = []
        self.notifiers: list[Notifier] = []
        self.published: list[int] = []
        self.consumed: list[int] = []
        self._next_partition = 0
        self._open_partitions(settings.num_partitions)

    def _open_partitions(self, count: int) -> None:
        """Open partitions up to ``count``; if one fails, those opened here are removed again."""
        before = len(self.partitions)
        try:
            self._open_more(count)
        except BaseException:
            for plog in self.partitions[before:]:
                plog.delete()
            del self.partitions[before:], self.notifiers[before:]
            del self.published[before:], self.consumed[before:]
            raise

    def _open_more(self, count: int) -> None:
        for p in range(len(self.partitions), count):
            s = self.settings
            self.partitions.append(
                PartitionLog(
                    self.directory / str(p),
                    segment_bytes=s.segment_bytes,
                    retention=s.retention,
                    files=self.files,
                )
            )
            self.notifiers.append(Notifier())
            self.published.append(0)
            self.consumed.append(0)

    def grow(self, count: int) -> None:
        """More partitions (never fewer, as in Kafka: keyed events of existing keys may move)."""
        if count <= len(self.partitions):
            raise BadRequest(
                f"topic {self.name!r} has {len(self.partitions)} partitions: ask for more, not {count}"
            )
        self._open_partitions(count)
        self.settings.num_partitions = count

    def choose_partition(self, key: str | None, partition: int | None) -> int:
        count = len(self.partitions)
        if partition is not None:
            if not 0 <= partition < count:
                raise NotFound(
                    f"partition {partition} of topic {self.name!r} does not exist (0..{count - 1})"
                )
            return partition
        if key is not None:
            return partition_for_key(key, count)
        chosen = self._next_partition
        self._next_partition = (chosen + 1) % count
        return chosen

    def log_of(self, partition: int) -> PartitionLog:
        if not 0 <= partition < len(self.partitions):
            raise NotFound(
                f"partition {partition} of topic {self.name!r} does not exist (0..{len(self.partitions) - 1})"
            )
        return self.partitions[partition]

    def _checked(self, partition: int, from_offset: int) -> PartitionLog:
        plog = self.log_of(partition)
        start = plog.start_offset
        if from_offset < start or from_offset > plog.next_offset:
            newest = plog.next_offset - 1 if plog.next_offset > start else None
            raise OffsetOutOfRange(from_offset, start, newest)
        return plog

    def read(self, partition: int, from_offset: int, limit: int) -> list[StreamEvent]:
        records = self._checked(partition, from_offset).read(from_offset, limit)
        events = [decode_stream_event(r, partition) for r in records]
        self.consumed[partition] += len(events)
        return events

    def read_raw(self, partition: int, from_offset: int, max_bytes: int) -> bytes:
        """Record bytes as stored (see :func:`meshplane.core.streamlog.scan_records`)."""
        return self._checked(partition, from_offset).read_raw(from_offset, max_bytes)

    def raw_span(self, partition: int, from_offset: int, max_bytes: int) -> tuple[Segment, int, int] | None:
        """Where :meth:`read_raw`'s bytes are, for serving them with ``sendfile``."""
        return self._checked(partition, from_offset).raw_span(from_offset, max_bytes)

    def partition_stats(self, partition: int) -> dict[str, Any]:
        plog = self.partitions[partition]
        start, end = plog.start_offset, plog.next_offset
        return {
            "partition_id": partition,
            "topic": self.name,
            "message_count": end - start,
            "total_bytes": plog.size_bytes,
            "min_offset": start,
            "max_offset": end - 1 if end > start else None,
            "next_offset": end,
            "segments": len(plog.segments),
            "published": self.published[partition],
            "consumed": self.consumed[partition],
        }


