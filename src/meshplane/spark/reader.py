"""The read side of ``format("meshplane")``: planning Spark partitions and reading them.

One Spark partition per topic partition range (split further for ``minPartitions``), offsets
``{"topic": {"0": 42}}``. Executors read raw records in large chunks and turn them into Arrow record
batches with a compiled scan (:mod:`meshplane.spark.columnar`), or the general decoder
(:mod:`meshplane.spark.decode`) for what the scan does not take.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from meshplane.errors import MeshplaneError, NotFound
from meshplane.spark import offsets as off
from meshplane.spark.decode import ARROW_SCHEMA, arrow_schema, decode_columns, to_arrow, to_tuples
from meshplane.spark.http import SyncStreamsClient
from meshplane.spark.identity import query_reader
from meshplane.spark.kafka_compat import quiet_runner_exit
from meshplane.spark.options import Options, SparkOptionError
from meshplane.streams.errors import CorruptRecords, OffsetOutOfRange

log = logging.getLogger(__name__)

PROGRESS_REFRESH = 30.0  # seconds between notes of an unchanged position (its "last said" stays fresh)
STARTING = ("startingOffsets", "startingOffsetsByTimestamp")
ENDING = ("endingOffsets", "endingOffsetsByTimestamp")
# columnar.scan_to_arrow: (raw records, first offset, end offset, topic, partition, schema) -> (batch, rows)
ScanToArrow = Callable[[bytes | memoryview, int, int, str, int, pa.Schema], tuple[pa.RecordBatch, int] | None]


class DataLossError(MeshplaneError):
    """Offsets a query needs were deleted by retention or damaged (and failOnDataLoss is true)."""

    kind = "data_loss"


def columns_of(options: Options) -> pa.Schema:
    """The source's columns for ``options`` (``columns``, ``includeHeaders``)."""
    return arrow_schema(kafka=options.columns == "kafka", headers=options.include_headers)


def open_client(options: Options) -> SyncStreamsClient:
    return SyncStreamsClient(
        options.url,
        options.token,
        timeout=options.request_timeout,
        local_reads=options.local_reads,
        retry_timeout=options.retry_timeout,
        vpn=options.vpn,
    )


class TopicRange(InputPartition):
    """Events [start, end) of one topic partition: one Spark partition. The first of a streaming
    batch carries the batch's end offsets (``progress``): its task notes them for the query."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.progress: off.TopicOffsets | None = None


def read_bounds(client: SyncStreamsClient, options: Options) -> off.Bounds:
    """topic -> partition -> (oldest, next) of what the query reads: its topics, the topics matching
    its pattern (now: topics created later are picked up), or its assigned partitions."""
    if options.topic_pattern is not None:
        pattern = re.compile(options.topic_pattern)
        listed = client.json("GET", "/topics").get("topics", [])
        names = sorted(str(t) for t in listed if pattern.fullmatch(str(t)))
        return {t: client.bounds(t) for t in names}
    bounds = {t: _bounds_once_created(client, t) for t in options.topics}
    if options.assign is None:
        return bounds
    assigned = {}
    for topic, partitions in options.assign.items():
        missing = [p for p in partitions if str(p) not in bounds[topic]]
        if missing:
            raise SparkOptionError(
                f"option assign names partitions {missing} of {topic!r}, which has {len(bounds[topic])}"
            )
        assigned[topic] = {str(p): bounds[topic][str(p)] for p in partitions}
    return assigned


_waiting_for: set[str] = set()  # topics said to be missing, once per process


def _bounds_once_created(client: SyncStreamsClient, topic: str) -> dict[str, tuple[int, int]]:
    """The topic's bounds; none while it does not exist: as Kafka's ``subscribe``, the query reads
    it once it is created (its partitions from their earliest offset)."""
    try:
        return client.bounds(topic)
    except NotFound:
        if topic not in _waiting_for:
            _waiting_for.add(topic)
            log.warning("meshplane topic %r does not exist yet; it is read once it is created", topic)
        return {}


def resolve_offsets(
    client: SyncStreamsClient,
    bounds: off.Bounds,
    offsets: str | None,
    times: int | dict[str, dict[str, int]] | None,
    default: str,
    names: tuple[str, str],
    no_match: str = "latest",
) -> off.TopicOffsets:
    """Offsets from an offsets option, or (winning over it, as in Kafka) from a timestamp option: per
    partition the first event stamped at or after the time. Where no event is, ``no_match`` says:
    ``latest`` (the end) or ``error`` (Kafka's default for starting timestamps).

    ``names`` are the (offsets, timestamp) options, for the messages."""
    if times is None:
        return off.resolve(offsets, bounds, default, names[0])
    if isinstance(times, dict) and set(times) - set(bounds):
        unread = ", ".join(sorted(set(times) - set(bounds)))
        raise off.OffsetsError(f"{names[1]} name topics that are not read: {unread}")
    found: dict[str, dict[str, int]] = {}
    for topic, parts in bounds.items():
        wanted = {p: times for p in parts} if isinstance(times, int) else times.get(topic, {})
        absent = sorted((p for p in wanted if p not in parts), key=lambda p: (len(p), p))
        if absent:
            raise off.OffsetsError(
                f"{names[1]}: topic {topic!r} has no partition {absent[0]!r} "
                f"(it has {', '.join(sorted(parts, key=int)) or 'none'})"
            )
        answers = {t: client.offsets_for_time(topic, t) for t in sorted(set(wanted.values()))}
        found[topic] = {p: answers[t][p] for p, t in wanted.items() if p in answers[t]}
        late = [
            f"{topic}/{p} at {t}" for p, t in wanted.items() if p in parts and found[topic][p] >= parts[p][1]
        ]
        if late and no_match == "error":
            raise off.OffsetsError(
                f"{names[1]}: no event is stamped at or after {', '.join(late)} ms "
                "(startingOffsetsByTimestampStrategy=error, as Kafka's default; latest starts at the end)"
            )
    return off.resolve(json.dumps(found), bounds, default, names[1])


def read_range(options: Options, part: TopicRange) -> Iterator[Any]:
    """Fetch [start, end) in large chunks; each chunk becomes one Arrow batch (or its rows as tuples)."""
    scan = _record_scan() if options.arrow else None
    schema = columns_of(options)
    client = open_client(options)
    offset = part.start
    try:
        while offset < part.end:
            try:
                data, _, _ = client.fetch_raw(part.topic, part.partition, offset, options.fetch_max_bytes)
            except OffsetOutOfRange as exc:
                if exc.oldest <= offset:
                    raise
                _data_lost(options, part.topic, part.partition, offset, exc.oldest, "deleted by retention")
                offset = exc.oldest
                continue
            except CorruptRecords as exc:  # the server found them damaged on its disk
                _data_lost(
                    options, part.topic, part.partition, offset, exc.next_offset, "unreadable (corrupt)"
                )
                offset = exc.next_offset
                continue
            rows, decoded = _decode(scan, data, offset, part, schema)
            if not rows:
                raise MeshplaneError(
                    f"meshplane {part.topic}/{part.partition}: no event at offset {offset} although the "
                    f"planned range ends at {part.end}: was the topic deleted and created again?"
                )
            yield from (
                decoded if options.projection is None else _project(decoded, schema, options.projection)
            )
            offset += rows
    finally:
        client.close()


def _project(decoded: Iterable[Any], schema: pa.Schema, names: tuple[str, ...]) -> Iterator[Any]:
    """Only the columns a user-given schema asked for, in its order."""
    indexes = [schema.get_field_index(n) for n in names]
    for item in decoded:
        if isinstance(item, pa.RecordBatch):
            yield pa.RecordBatch.from_arrays([item.column(i) for i in indexes], names=list(names))
        else:
            yield tuple(item[i] for i in indexes)


def read_partition(options: Options, partition: InputPartition) -> Iterator[Any]:
    """What Spark asks executors to read; PySpark hands an empty ``InputPartition(None)`` when the
    plan had no partitions (an empty topic, startingOffsets=latest): nothing to read then."""
    if not isinstance(partition, TopicRange):
        return iter(())
    return read_range(options, partition)


_loaded_scan: ScanToArrow | None = None


def _record_scan() -> ScanToArrow:
    """The compiled record scan, loaded on an executor's first Arrow read (never on the driver or in
    Spark's planning workers, which only unpickle this module and need not load numba).

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker, and
    numba's loaded compiler adds tens of thousands of long-lived objects to walk in each. Once the
    scan is loaded, what exists is frozen out of later collections (``gc.freeze``, made for
    long-lived objects), so each collection sees only a task's own objects.
    """
    global _loaded_scan
    if _loaded_scan is None:
        from meshplane.spark.columnar import scan_to_arrow

        scan_to_arrow(b"", 0, 0, "", 0, ARROW_SCHEMA)  # loads the cached machine code now
        gc.collect()  # nothing collectable is frozen with the rest
        gc.freeze()
        _keep_freed_chunks()
        _loaded_scan = scan_to_arrow
    return _loaded_scan


def _keep_freed_chunks() -> None:
    """Let glibc's malloc keep freed blocks of up to 32 MiB instead of returning them to the kernel.

    Every chunk's columns (8 MiB for a 2 MiB fetch) are freed once Spark has sent their batch on. By
    default glibc maps such blocks fresh and unmaps them when freed, so the next chunk's columns fault
    their pages in again, zeroed (a large share of the executors' work; bench/results has the
    figures). With these two settings (made for this, see mallopt(3)) a worker reuses the memory; it
    holds at most ~128 MiB it no longer uses. Elsewhere than glibc, nothing changes.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 128 << 20)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def _decode(
    scan: ScanToArrow | None, data: bytes | memoryview, first: int, part: TopicRange, schema: pa.Schema
) -> tuple[int, Iterable[Any]]:
    """One fetched chunk: (records, Arrow batches or tuples). With ``scan`` (Arrow), batches come from
    the compiled scan, or from the general decoder for chunks the scan does not take."""
    if scan is not None:
        fast = scan(data, first, part.end, part.topic, part.partition, schema)
        if fast is not None:
            batch, rows = fast
            return rows, [batch]
    cols = decode_columns(data, first, part.end)
    if scan is not None:
        return len(cols.offsets), [to_arrow(cols, part.topic, part.partition, schema)]
    return len(cols.offsets), to_tuples(cols, part.topic, part.partition, schema)


def _data_lost(options: Options, topic: str, partition: int, first: int, oldest: int, why: str) -> None:
    message = (
        f"meshplane {topic}/{partition}: offsets {first}..{oldest - 1} ({oldest - first} events) were "
        f"{why} before this query read them"
    )
    if options.fail_on_data_loss:
        raise DataLossError(
            message + ". Set failOnDataLoss=false to skip them (the query then continues at "
            f"offset {oldest})."
        )
    log.warning("%s; skipped (failOnDataLoss=false)", message)


def note_progress(
    options: Options,
    name: str,
    identity: str,
    done: off.TopicOffsets,
    client: SyncStreamsClient | None = None,
) -> bool:
    """Record ``done`` as reader ``name``'s position on each topic. Best effort: a failure is logged,
    never raised (False)."""
    progress = client or SyncStreamsClient(options.url, options.token, timeout=5.0, vpn=options.vpn)
    try:
        for topic, parts in done.items():
            path = f"/topics/{urllib.parse.quote(topic, safe='')}/readers/{urllib.parse.quote(name, safe='')}"
            try:
                progress.json("PUT", path, {"offsets": parts, "identity": identity})
            except NotFound:
                continue  # a topic deleted since, or not made yet
    except (MeshplaneError, OSError) as exc:
        log.warning("meshplane: cannot record this query's progress as %r (%s); lag not shown", name, exc)
        return False
    finally:
        if client is None:
            progress.close()
    return True


def plan(
    options: Options, start: off.TopicOffsets, end: off.TopicOffsets, bounds: off.Bounds
) -> list[TopicRange]:
    """The Spark partitions for [start, end), checking for data deleted by retention; ranges are split
    evenly when there are fewer than ``minPartitions``."""
    ranges = []
    for topic, partition, first, until in off.ranges(off.fill_new_partitions(start, bounds), end):
        oldest = bounds[topic][str(partition)][0] if str(partition) in bounds.get(topic, {}) else first
        if first < oldest:
            _data_lost(options, topic, partition, first, oldest, "deleted by retention")
            first = oldest
        if first < until:
            ranges.append((topic, partition, first, until))
    return [TopicRange(*r) for r in off.split(ranges, options.min_partitions or 0)]


class MeshplaneStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options) -> None:
        quiet_runner_exit()  # this runs in PySpark's streaming source runner
        options.check_streaming()
        self.options = options
        self._client = open_client(options)
        self._target: off.TopicOffsets | None = None
        self._last_batch_at = -math.inf  # the first batch comes at once, as Kafka's does
        # Progress notes wait for no retry: a query never slows down for its lag view.
        self._progress = SyncStreamsClient(options.url, options.token, timeout=5.0, vpn=options.vpn)
        self._progress_paused_until = 0.0
        self._noted: off.TopicOffsets | None = None
        self._noted_at = 0.0

    def _bounds(self) -> off.Bounds:
        return read_bounds(self._client, self.options)

    @staticmethod
    def _ends(bounds: off.Bounds) -> off.TopicOffsets:
        return off.normalize({t: {p: b[1] for p, b in parts.items()} for t, parts in bounds.items()})

    def initialOffset(self) -> dict:  # type: ignore[type-arg]
        o = self.options
        return resolve_offsets(
            self._client,
            self._bounds(),
            o.starting_offsets,
            o.starting_time,
            "latest",
            STARTING,
            o.starting_no_match,
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_events_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends(self._bounds())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # type: ignore[type-arg]
        # Spark asks once the previous batch has completed: ``start`` is where the query is. (Its
        # commit() of a batch comes only when a next one is planned: never for the last one.)
        self._note_progress(start)
        bounds = self._bounds()
        begin = off.fill_new_partitions(start, bounds)
        if off.past_end(begin, bounds):  # a second look first: a server of several may lag a moment
            bounds = self._bounds()
            begin = off.fill_new_partitions(start, bounds)
        for topic, partition, first, end in off.past_end(begin, bounds):
            # Events the query counted on are gone (a topic deleted and made again, a start given
            # past the end): Kafka reports data loss, and so does this.
            message = (
                f"meshplane {topic}/{partition}: the query is at offset {first}, past the partition's end "
                f"({end}): the events it expected there do not exist (was the topic made again?)"
            )
            if self.options.fail_on_data_loss:
                raise DataLossError(message + ". Set failOnDataLoss=false to go on from the end.")
            log.warning("%s; going on from offset %d (failOnDataLoss=false)", message, end)
            begin[topic][partition] = end
        if not self.options.fail_on_data_loss:
            begin = off.skip_deleted(begin, bounds)  # a deleted range is jumped in one batch, not walked
        latest = off.cap(self._ends(bounds), self._target)
        minimum = self.options.min_events_per_trigger
        if minimum is not None and self._target is None:
            now = time.monotonic()
            waited = now - self._last_batch_at
            if off.backlog(begin, latest) < minimum and waited < self.options.max_trigger_delay:
                return off.normalize(start)  # no batch yet: too few events, and not waited long enough
            self._last_batch_at = now
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return off.admit(begin, latest, max_rows)

    def reportLatestOffset(self) -> dict:  # type: ignore[type-arg]
        return self._ends(self._bounds())

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:  # type: ignore[type-arg]
        ranges = plan(self.options, start, end, self._bounds())
        if ranges and self.options.reader_name is None:  # each query its own view: its tasks know it
            ranges[0].progress = off.normalize(end)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from read_partition(self.options, partition)
        if isinstance(partition, TopicRange) and partition.progress is not None:
            name, identity = query_reader(TaskContext.get(), self.options.default_reader_name)
            note_progress(self.options, name, identity, partition.progress)

    def commit(self, end: dict) -> None:  # type: ignore[type-arg]
        """The checkpoint is the position; the server is told (see :meth:`_note_progress`)."""
        self._note_progress(end)

    def _note_progress(self, done: off.TopicOffsets) -> None:
        """With a ``readerName``, tell the server where the query is (a read-only view for its lag,
        ``GET /topics/{t}/readers``): the end of its last completed batch, when it moves, else every
        ``PROGRESS_REFRESH`` seconds. (Without one, each query's tasks note it under the query's own
        name: this planner is not told which query it plans for.)"""
        name, now = self.options.reader_name, time.monotonic()
        fresh = done == self._noted and now - self._noted_at < PROGRESS_REFRESH
        if not name or fresh or now < self._progress_paused_until:
            return
        self._noted, self._noted_at = off.normalize(done), now
        if not note_progress(self.options, name, "readerName", done, self._progress):
            self._progress_paused_until = now + 60.0  # the query goes on; the next note in a minute

    def stop(self) -> None:
        self._client.close()
        self._progress.close()


class MeshplaneBatchReader(DataSourceReader):
    """Backfills: startingOffsets (default earliest) to endingOffsets (default latest)."""

    def __init__(self, options: Options) -> None:
        options.check_batch()
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        client = open_client(o)
        try:
            bounds = read_bounds(client, o)
            start = resolve_offsets(
                client, bounds, o.starting_offsets, o.starting_time, "earliest", STARTING, o.starting_no_match
            )
            end = resolve_offsets(client, bounds, o.ending_offsets, o.ending_time, "latest", ENDING)
        finally:
            client.close()
        off.check_written(start, bounds, STARTING[1] if o.starting_time is not None else STARTING[0])
        off.check_written(end, bounds, ENDING[1] if o.ending_time is not None else ENDING[0])
        off.check_order(start, end)
        return plan(self.options, start, end, bounds)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options, partition)
