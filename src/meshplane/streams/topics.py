"""Partitioned topics: one log per partition, key routing, reads checked against retention."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from meshplane.core.groups import GroupCoordinator
from meshplane.core.streamlog import RetentionPolicy, partition_for_key
from meshplane.streams.config import StreamsConfig, check_name
from meshplane.streams.errors import (
    BadRequest,
    Conflict,
    LimitReached,
    NotFound,
    OffsetOutOfRange,
    StorageError,
    storage_error,
)
from meshplane.streams.events import Notifier, StreamEvent, decode_stream_event
from meshplane.streams.files import FilePool, changed, write_atomic
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


class PartitionState(Protocol):
    """What every partition shows without I/O: its bounds and size (a local log, or a cached view of
    a remote one)."""

    @property
    def start_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def segment_count(self) -> int: ...


P = TypeVar("P", bound=PartitionState)
RawSpan = tuple[Segment, int, int]  # segment, position, length


class TopicBase(Generic[P]):
    """A topic's name, settings, partitions and counters: what every storage backend shares."""

    def __init__(self, name: str, settings: TopicSettings) -> None:
        self.name = name
        self.settings = settings
        self.partitions: list[P] = []
        self.notifiers: list[Notifier] = []
        self.published: list[int] = []
        self.consumed: list[int] = []
        self._next_partition = 0
        # A paused queue's topic: it keeps storing, its readers get nothing until it is let go
        # (looking, ``counted=False``, still sees the events).
        self.held = False

    def _add_partition(self, partition: P) -> None:
        self.partitions.append(partition)
        self.notifiers.append(Notifier())
        self.published.append(0)
        self.consumed.append(0)

    def choose_partition(self, key: str | bytes | None, partition: int | None) -> int:
        count = len(self.partitions)
        if partition is not None:
            if not 0 <= partition < count:
                raise NotFound(
                    f"partition {partition} of topic {self.name!r} does not exist (0..{count - 1})"
                )
            return partition
        if key is not None:
            return partition_for_key(key, count) if count > 1 else 0
        chosen = self._next_partition
        self._next_partition = (chosen + 1) % count
        return chosen

    def log_of(self, partition: int) -> P:
        if not 0 <= partition < len(self.partitions):
            raise NotFound(
                f"partition {partition} of topic {self.name!r} does not exist (0..{len(self.partitions) - 1})"
            )
        return self.partitions[partition]

    def check_offset(self, partition: int, from_offset: int) -> P:
        """The partition, if ``from_offset`` is within it (its end included: the next event's place)."""
        plog = self.log_of(partition)
        start = plog.start_offset
        if from_offset < start or from_offset > plog.next_offset:
            newest = plog.next_offset - 1 if plog.next_offset > start else None
            raise OffsetOutOfRange(from_offset, start, newest)
        return plog

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
            "segments": plog.segment_count,
            "published": self.published[partition],
            "consumed": self.consumed[partition],
        }


class Topic(TopicBase[PartitionLog]):
    """A topic on the local disk: one segment log per partition."""

    def __init__(
        self,
        name: str,
        directory: Path,
        settings: TopicSettings,
        files: FilePool | None = None,
        before_seal: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name, settings)
        self.directory = directory
        self.files = files
        self.before_seal = before_seal
        self._open_partitions(settings.num_partitions)

    def _open_partitions(self, count: int) -> None:
        """Open partitions up to ``count``; if one fails, those opened here are closed again (at a start
        they hold events: only a grow, whose new ones are empty, removes them)."""
        before = len(self.partitions)
        try:
            self._open_more(count)
        except BaseException:
            for plog in self.partitions[before:]:
                plog.close()
            del self.partitions[before:], self.notifiers[before:]
            del self.published[before:], self.consumed[before:]
            raise

    def _open_more(self, count: int) -> None:
        for p in range(len(self.partitions), count):
            s = self.settings
            self._add_partition(
                PartitionLog(
                    self.directory / str(p),
                    segment_bytes=s.segment_bytes,
                    retention=s.retention,
                    files=self.files,
                    before_seal=self.before_seal,
                )
            )

    def grow(self, count: int) -> None:
        """More partitions (never fewer, as in Kafka: keyed events of existing keys may move)."""
        if count <= len(self.partitions):
            raise BadRequest(
                f"topic {self.name!r} has {len(self.partitions)} partitions: ask for more, not {count}"
            )
        try:
            self._open_partitions(count)
        except BaseException:
            # Its new partitions, also the one that failed (which made its directory first): left, a
            # restart would count them (and a deleted topic, whose directory they keep, would come back).
            for p in range(len(self.partitions), count):
                _remove_tree(self.directory / str(p))
            raise
        self.settings.num_partitions = count

    def read(
        self, partition: int, from_offset: int, limit: int, *, counted: bool = True
    ) -> list[StreamEvent]:
        plog = self.check_offset(partition, from_offset)
        if counted and self.held:
            return []
        records = plog.read(from_offset, limit)
        events = [decode_stream_event(r, partition) for r in records]
        if counted:
            self.consumed[partition] += len(events)
        return events

    def append_all(
        self,
        partitions: list[int],
        encoded: list[bytes],
        timestamp: int,
        remember: Callable[[list[tuple[int, int]]], None],
    ) -> tuple[list[tuple[int, int]], list[PartitionLog]]:
        """Append each event to its partition (:meth:`choose_partition`), all or nothing: when a write
        fails, or ``remember`` (called with the places before anyone is woken) does, what the other
        partitions took is taken back (nobody has read it). The places, and the logs written."""
        by_partition: dict[int, list[bytes]] = {}
        places: list[tuple[int, int]] = []
        for p, payload in zip(partitions, encoded, strict=True):
            by_partition.setdefault(p, []).append(payload)
            places.append((p, len(by_partition[p]) - 1))
        firsts: dict[int, int] = {}
        marks = {p: self.partitions[p].mark() for p in by_partition}
        try:
            for p, batch in by_partition.items():
                firsts[p] = self.partitions[p].append(batch, timestamp)
            result = [(p, firsts[p] + i) for p, i in places]
            remember(result)
        except (OSError, StorageError) as exc:
            for p in firsts:
                self.partitions[p].undo(marks[p])
            if isinstance(exc, StorageError):
                raise
            raise storage_error(exc, f"publish to {self.name!r}") from exc
        for p, batch in by_partition.items():
            self.published[p] += len(batch)
            self.notifiers[p].notify()
        return result, [self.partitions[p] for p in by_partition]

    def offsets_for_time(self, timestamp_ms: int) -> list[int]:
        """Per partition, the first offset stamped at or after ``timestamp_ms`` (the end when none is)."""
        return [plog.offset_for_time(timestamp_ms) for plog in self.partitions]

    def read_raw(self, partition: int, from_offset: int, max_bytes: int) -> bytes:
        """Record bytes as stored (see :func:`meshplane.core.streamlog.scan_records`)."""
        plog = self.check_offset(partition, from_offset)
        return b"" if self.held else plog.read_raw(from_offset, max_bytes)

    def raw_span(self, partition: int, from_offset: int, max_bytes: int) -> RawSpan | None:
        """Where :meth:`read_raw`'s bytes are, for serving them with ``sendfile``."""
        plog = self.check_offset(partition, from_offset)
        return None if self.held else plog.raw_span(from_offset, max_bytes)


class TopicStore:
    """The topics of a data directory: loaded, created (or not at all), grown and deleted."""

    def __init__(
        self,
        folder: Path,
        files: FilePool,
        config: StreamsConfig,
        report: Callable[[str], None],
        set_aside: Callable[[Path, str], None],
        before_seal: Callable[[], None] | None = None,
    ) -> None:
        self.folder = folder
        self.topics: dict[str, Topic] = {}
        # Topics outside the count limits: a Message VPN's mesh queues, bounded by the mesh's queue
        # limits (the mesh's Queues names them); present or not.
        self.exempt: set[str] = set()
        # Every topic's partitions, kept as topics come, grow and go: a node with 10,000 queues (a
        # topic each) counted them all again for each new one, and made its queues in O(n^2).
        self._partitions = 0
        self.config = config
        self._files = files
        self._before_seal = before_seal
        self._report = report
        self._set_aside = set_aside

    def load(self, directory: Path) -> None:
        path = directory / "topic.json"
        partitions = sum(1 for p in directory.iterdir() if p.is_dir() and p.name.isdigit())
        try:
            settings = msgspec.json.decode(path.read_bytes(), type=TopicSettings)
        except FileNotFoundError:
            if not partitions:
                return
            self._report(f"topic {directory.name}: topic.json is missing; {partitions} partitions found")
            settings = TopicSettings(partitions, segment_bytes=self.config.segment_bytes)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._set_aside(path, f"topic {directory.name}: topic.json is unreadable ({exc})")
            settings = TopicSettings(max(partitions, 1), segment_bytes=self.config.segment_bytes)
        changed = not settings.incarnation or not path.exists() or partitions > settings.num_partitions
        settings.num_partitions = max(settings.num_partitions, partitions)
        settings.incarnation = settings.incarnation or uuid.uuid4().hex
        name = directory.name
        self.topics[name] = topic = Topic(name, directory, settings, self._files, self._before_seal)
        self._partitions += len(topic.partitions)
        if changed:
            try:
                write_atomic(path, msgspec.json.encode(settings))
            except OSError as exc:
                self._report(f"topic {directory.name}: topic.json not rewritten ({exc})")

    def create(
        self,
        name: str,
        num_partitions: int | None = None,
        replication_factor: int = 1,
        retention: RetentionPolicy | None = None,
        segment_bytes: int | None = None,
        *,
        sync: bool = True,
    ) -> Topic:
        """``sync=False``: ``topic.json`` is not fsynced here; the caller makes it durable
        (:func:`~meshplane.streams.files.sync_replaced`, in a worker thread) before it answers."""
        check_name("topic", name)
        if name in self.topics:
            raise Conflict(f"topic {name!r} already exists")
        counts = (self.topic_count, self.partition_count)
        partitions = check_new_topic(self.config, counts, num_partitions, name in self.exempt)
        if replication_factor != 1:
            raise BadRequest("replication_factor must be 1: meshplane streams run on one node")
        segment = self.config.segment_bytes if segment_bytes is None else segment_bytes
        if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1024:
            raise BadRequest(f"segment_bytes must be an integer >= 1024, not {segment!r}")
        settings = TopicSettings(
            partitions,
            replication_factor,
            retention or RetentionPolicy(),
            segment,
            time.time(),
            incarnation=uuid.uuid4().hex,
        )
        directory = self.folder / name
        try:
            topic = Topic(name, directory, settings, self._files, self._before_seal)
        except (OSError, StorageError) as exc:
            _remove_tree(directory)
            if isinstance(exc, StorageError):
                raise
            raise storage_error(exc, f"creating topic {name!r}") from exc
        try:
            write_atomic(directory / "topic.json", msgspec.json.encode(settings), sync=sync)
        except OSError as exc:
            for plog in topic.partitions:
                plog.delete()
            _remove_tree(directory)
            raise storage_error(exc, f"creating topic {name!r}") from exc
        self.topics[name] = topic
        self._partitions += len(topic.partitions)
        return topic

    def get(self, name: str) -> Topic:
        found = self.topics.get(check_name("topic", name))
        if found is None:
            raise NotFound(f"topic {name!r} not found")
        return found

    def grow(self, name: str, count: int) -> Topic:
        topic = self.get(name)
        if count > 10_000:
            raise BadRequest("num_partitions must be <= 10000")
        check_partition_budget(self.config, self.partition_count, count - len(topic.partitions))
        before = len(topic.partitions)
        try:
            topic.grow(count)
            write_atomic(topic.directory / "topic.json", msgspec.json.encode(topic.settings))
        except OSError as exc:
            raise storage_error(exc, f"adding partitions to {name!r}") from exc
        finally:
            self._partitions += len(topic.partitions) - before
        return topic

    def set_retention(self, name: str, retention: RetentionPolicy) -> Topic:
        """Change a topic's retention: saved first, then applied by the next retention pass (a
        shorter one deletes whole segments then; a longer one brings nothing back)."""
        topic = self.get(name)
        settings = msgspec.structs.replace(topic.settings, retention=retention)
        try:
            write_atomic(topic.directory / "topic.json", msgspec.json.encode(settings))
        except OSError as exc:
            raise storage_error(exc, f"changing the retention of {name!r}") from exc
        topic.settings = settings
        for plog in topic.partitions:
            plog.retention = retention
        return topic

    def delete(self, name: str) -> bool:
        topic = self.topics.pop(check_name("topic", name), None)
        if topic is None:
            return False
        self._partitions -= len(topic.partitions)
        for plog in topic.partitions:
            plog.delete()
        (topic.directory / "topic.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            topic.directory.rmdir()
        changed(topic.directory)
        return True

    @property
    def topic_count(self) -> int:
        """Topics held to the count limits (not :attr:`exempt`)."""
        return len(self.topics) - sum(1 for name in self.exempt if name in self.topics)

    @property
    def partition_count(self) -> int:
        """Their partitions."""
        exempt = sum(len(self.topics[name].partitions) for name in self.exempt if name in self.topics)
        return self._partitions - exempt


def check_partition_budget(config: StreamsConfig, total: int, adding: int) -> None:
    """Whether ``adding`` partitions to the ``total`` counted stay within the limit."""
    if total + adding > config.max_partitions:
        raise LimitReached(
            f"partition limit reached: {total} of {config.max_partitions} in use, {adding} asked",
            "partitions",
        )


def check_new_topic(
    config: StreamsConfig, counts: tuple[int, int], num_partitions: int | None, exempt: bool = False
) -> int:
    """A new topic's partition count (the default when none is asked), within every limit given the
    ``counts`` (topics, partitions) held to them; an ``exempt`` topic is not."""
    if not exempt and counts[0] >= config.max_topics:
        raise LimitReached(f"topic limit reached ({config.max_topics} topics)", "topics")
    partitions = config.default_partitions if num_partitions is None else num_partitions
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 10_000:
        raise BadRequest(f"num_partitions must be an integer in 1..10000, not {partitions!r}")
    if not exempt:
        check_partition_budget(config, counts[1], partitions)
    return partitions


def _remove_tree(directory: Path) -> None:
    """Remove what a failed create left (best effort: the disk may be failing)."""
    for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() else path.unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()
    changed(directory)


def group_lag(
    groups: Iterable[GroupCoordinator], topics: Mapping[str, TopicBase[Any]]
) -> Iterator[tuple[str, int, int]]:
    """(group, partition, lag) for every group of an existing topic."""
    for group in groups:
        topic = topics.get(group.topic)
        if topic is None:
            continue
        for p, plog in enumerate(topic.partitions[: group.partitions]):
            committed = group.committed.get(p, plog.start_offset)
            yield group.group_id, p, max(0, plog.next_offset - committed)
