"""Answers to idempotent publishes, so that a repeated publish appends nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from meshplane.core.idempotency import Mark, decode_mark, marked, reassemble
from meshplane.core.streamlog import MARKED_DECODER, StoredEvent
from meshplane.streams.errors import CorruptRecords
from meshplane.streams.files import RecordFile

if TYPE_CHECKING:
    from meshplane.streams.topics import Topic

MARKED_ARRAY = b"\x96"  # msgpack's fixarray of 6: only a MarkedEvent has a sixth field

log = logging.getLogger(__name__)


class IdempotencyTable:
    """The answers to recent idempotent publishes, kept in a file across restarts.

    Bounded three ways: at most ``capacity`` keys, about ``max_bytes`` of memory, and ``ttl`` seconds
    each; the oldest go first. A publish repeated within those bounds appends nothing; one repeated
    later appends again. Keys carry the topic's incarnation, so a topic deleted and made again
    starts with none.
    """

    ENTRY_OVERHEAD = 200  # bytes of a dict entry, its tuple and list, roughly

    def __init__(self, capacity: int = 100_000, max_bytes: int = 64 << 20, ttl: float = 7 * 86400.0) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.entries: OrderedDict[str, tuple[float, list[tuple[int, int]]]] = OrderedDict()
        self.bytes = 0
        self._file: RecordFile | None = None
        self._sync = True
        self.closed = False

    def open(self, path: Path, *, sync: bool = True, topics: Mapping[str, Topic] | None = None) -> None:
        """Load the answers; with ``topics``, made to agree with their logs after a crash."""
        self._file, self._sync = RecordFile(path), sync
        now = time.time()
        for payload in self._file.load():
            try:
                key, places, at = msgspec.msgpack.decode(payload)
                self._remember(key, [(int(p), int(o)) for p, o in places], float(at))
            except (msgspec.DecodeError, ValueError, TypeError):
                continue  # an entry of an older format, or garbage: forgotten (the bound allows it)
        if topics is not None:
            self._agree_with(topics)
        self.expire(now)
        try:
            self._rewrite()
        except OSError as exc:  # a full disk: appended to as it is, compacted later
            log.warning("%s: not compacted (%s)", path, exc)

    def _agree_with(self, topics: Mapping[str, Topic]) -> None:
        """An answer whose events are not in the log (lost with the machine) is dropped: a retry
        appends them. An answer lost from this file's tail while its events reached the log is
        rebuilt from their marks (only the active segments need searching: :meth:`sync` runs before
        a segment is sealed)."""
        dropped = [key for key, (_, places) in self.entries.items() if not _stored(key, places, topics)]
        for key in dropped:
            self._drop(key)
        rebuilt = 0
        for name, topic in topics.items():
            found = list(_marks(topic))
            times = {mark.key: at for _, _, mark, at in found}
            for key, places in reassemble((p, o, mark) for p, o, mark, _ in found).items():
                full = f"{name}/{topic.settings.incarnation}/{key}"
                if full not in self.entries:
                    self._remember(full, places, times[key])
                    rebuilt += 1
        if dropped or rebuilt:
            log.warning(
                "idempotency answers: %d dropped (their events were lost), %d rebuilt from the logs",
                len(dropped),
                rebuilt,
            )

    def sync(self) -> None:
        """The answers written so far, on disk."""
        if self._file is not None and self._sync and not self.closed:
            os.fsync(self._file.sync_fd())

    def get(self, key: str) -> list[tuple[int, int]] | None:
        found = self.entries.get(key)
        if found is None or found[0] < time.time() - self.ttl:
            return None
        return found[1]

    def put(self, key: str, places: list[tuple[int, int]]) -> None:
        """Remember an answer; written to the file first (an OSError leaves nothing remembered)."""
        at = time.time()
        if self._file is not None:
            self._file.append(msgspec.msgpack.encode((key, places, at)))
        self._remember(key, places, at)
        if self._file is not None and self._file.records > 2 * self.capacity:
            with contextlib.suppress(OSError):  # compaction can wait for a later put
                self._rewrite()

    def forget_topic(self, topic: str) -> None:
        prefix = topic + "/"
        for key in [k for k in self.entries if k.startswith(prefix)]:
            self._drop(key)

    def expire(self, now: float) -> None:
        while self.entries:
            key, (at, _) = next(iter(self.entries.items()))
            if at >= now - self.ttl:
                break
            self._drop(key)

    def _cost(self, key: str, places: list[tuple[int, int]]) -> int:
        return self.ENTRY_OVERHEAD + len(key) + 72 * len(places)

    def _remember(self, key: str, places: list[tuple[int, int]], at: float) -> None:
        if key in self.entries:
            self._drop(key)
        self.entries[key] = (at, places)
        self.bytes += self._cost(key, places)
        while len(self.entries) > self.capacity or (self.bytes > self.max_bytes and len(self.entries) > 1):
            self._drop(next(iter(self.entries)))

    def _drop(self, key: str) -> None:
        _, places = self.entries.pop(key)
        self.bytes -= self._cost(key, places)

    def _rewrite(self) -> None:
        """Compact the file to the entries kept."""
        if self._file is not None:
            payloads = [msgspec.msgpack.encode((k, p, at)) for k, (at, p) in self.entries.items()]
            self._file.rewrite(payloads, sync=self._sync)

    def sync_fd(self) -> int:
        assert self._file is not None
        return self._file.sync_fd()

    def __repr__(self) -> str:
        return f"idempotency answers {self._file}"

    def close(self) -> None:
        self.closed = True
        if self._file is not None:
            self._file.close()


def _stored(key: str, places: list[tuple[int, int]], topics: Mapping[str, Topic]) -> bool:
    name, incarnation, _ = key.split("/", 2) if key.count("/") >= 2 else ("", "", "")
    topic = topics.get(name)
    if topic is None or topic.settings.incarnation != incarnation:
        return False
    count = len(topic.partitions)
    return all(0 <= p < count and o < topic.partitions[p].next_offset for p, o in places)


def _marks(topic: Topic) -> Iterator[tuple[int, int, Mark, float]]:
    """(partition, offset, mark, time) of the marked events in each partition's active segment."""
    for p, plog in enumerate(topic.partitions):
        offset, end = plog.active.base_offset, plog.next_offset
        while offset < end:
            try:
                records = plog.read(offset, 1000)
            except CorruptRecords as exc:  # unreadable records carry no answer
                offset = exc.next_offset
                continue
            if not records:
                break
            for record in records:
                if record.payload[:1] != MARKED_ARRAY:  # no mark: no decoding (most records)
                    continue
                try:
                    text = MARKED_DECODER.decode(record.payload).idempotency
                except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
                    continue
                mark = decode_mark(text) if text else None
                if mark is not None:
                    yield p, record.offset, mark, record.timestamp_ms / 1000
            offset = records[-1].offset + 1


def routed(
    topic: Topic, events: list[StoredEvent], placed: list[int | None], idempotency_key: str | None
) -> tuple[list[int], list[StoredEvent]]:
    """Each event's partition (``placed[i]``, else by key), and the events to append: with a key,
    marked (the key in the log too, so the answer outlives a crash that loses this file's tail)."""
    partitions = [topic.choose_partition(e.key, p) for e, p in zip(events, placed, strict=True)]
    return partitions, events if idempotency_key is None else marked(events, partitions, idempotency_key)
