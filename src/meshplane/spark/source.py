"""The ``meshplane`` format for Spark: a Structured Streaming (and batch) source and sink.

    spark.dataSource.register(MeshplaneDataSource)
    events = (spark.readStream.format("meshplane")
              .option("url", "http://127.0.0.1:15500").option("topic", "orders")
              .option("startingOffsets", "earliest").option("maxEventsPerTrigger", 100000).load())
    query = (rows.writeStream.format("meshplane").option("topic", "results")
             .option("checkpointLocation", "/tmp/ckpt").start())

Modelled on Spark's Kafka source: one Spark partition per topic partition, offsets
``{"topic": {"0": 42}}``, ``startingOffsets`` / ``endingOffsets`` (earliest | latest | JSON, -2 / -1),
``maxEventsPerTrigger`` (alias ``maxOffsetsPerTrigger``), ``failOnDataLoss``. Executors read raw
records in large chunks and turn them into Arrow record batches with a compiled scan. The sink
publishes through the streams API with an idempotency key per (query, batchId, partition, chunk): a
replayed batch publishes nothing twice.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import logging
import operator
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from meshplane.core.streamlog import EVENT_DECODER, scan_records
from meshplane.spark import offsets as off
from meshplane.spark.http import SyncStreamsClient
from meshplane.streams.errors import CorruptRecords, OffsetOutOfRange

log = logging.getLogger(__name__)

SCHEMA = (
    "key string, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "event_type string, id string, metadata map<string,string>"
)
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("event_type", pa.string()),
        ("id", pa.string()),
        ("metadata", pa.map_(pa.string(), pa.string())),
    ]
)
# columnar.scan_to_arrow: (raw records, first offset, end offset, topic, partition, schema) -> (batch, rows)
ScanToArrow = Callable[[bytes | memoryview, int, int, str, int, pa.Schema], tuple[pa.RecordBatch, int] | None]
BASE64 = "meshplane.encoding"  # metadata marking a value that was not UTF-8 (carried as base64)
PUBLISH_CHUNK = 1000


class DataLossError(RuntimeError):
    """Offsets a query needs were deleted by retention (and failOnDataLoss is true)."""


@dataclass(frozen=True)
class Options:
    url: str
    token: str | None
    topics: tuple[str, ...]
    starting_offsets: str | None
    ending_offsets: str | None
    max_events_per_trigger: int | None
    fail_on_data_loss: bool
    fetch_max_bytes: int
    event_type: str
    arrow: bool = True  # yield Arrow record batches (false: one tuple per row, slower; for comparison)
    local_reads: bool = True  # executors on the server's host read its segment files (see SyncStreamsClient)

    @classmethod
    def parse(cls, options: Any) -> Options:
        get = options.get
        topics_text = get("topics") or get("topic") or get("subscribe") or ""
        topics = tuple(t.strip() for t in str(topics_text).split(",") if t.strip())
        limit = get("maxEventsPerTrigger") or get("maxOffsetsPerTrigger")
        fail, local = (str(get(name, "true")).lower() for name in ("failOnDataLoss", "localReads"))
        for name, value in (("failOnDataLoss", fail), ("localReads", local)):
            if value not in ("true", "false"):
                raise ValueError(f"{name} must be true or false, not {value!r}")
        try:
            max_events = None if limit is None else int(limit)
            # 2 MiB: a chunk and its columns stay near the cache (4 MiB read ~5% slower, 512 KiB ~15%)
            fetch_bytes = int(get("fetchMaxBytes", 2 << 20))
        except ValueError as exc:
            raise ValueError(f"maxEventsPerTrigger and fetchMaxBytes must be integers: {exc}") from None
        if max_events is not None and max_events < 1:
            raise ValueError("maxEventsPerTrigger must be >= 1")
        return cls(
            url=str(get("url") or os.environ.get("MESHPLANE_STREAMS_URL", "http://127.0.0.1:15500")),
            token=get("token") or os.environ.get("MESHPLANE_STREAMS_TOKEN"),
            topics=topics,
            starting_offsets=get("startingOffsets"),
            ending_offsets=get("endingOffsets"),
            max_events_per_trigger=max_events,
            fail_on_data_loss=fail == "true",
            fetch_max_bytes=fetch_bytes,
            event_type=str(get("eventType", "spark")),
            arrow=str(get("arrow", "true")).lower() != "false",
            local_reads=local == "true",
        )

    def client(self) -> SyncStreamsClient:
        return SyncStreamsClient(self.url, self.token, local_reads=self.local_reads)

    def need_topics(self) -> tuple[str, ...]:
        if not self.topics:
            raise ValueError("set the topic to read: .option('topic', 'name') (or 'topics' a,b)")
        return self.topics


class TopicRange(InputPartition):
    """Events [start, end) of one topic partition: one Spark partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


# --- reading ---------------------------------------------------------------------------------------


def _value(data: Any, metadata: dict[str, str] | None) -> bytes:
    if metadata and metadata.get(BASE64) == "base64" and isinstance(data, str):
        return base64.b64decode(data)
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    return msgspec.json.encode(data)


@dataclass
class Columns:
    """Decoded records of one fetch, column by column."""

    keys: list[str | None]
    values: list[bytes]
    offsets: list[int]
    stamps_us: list[int]
    types: list[str]
    ids: list[str]
    metadata: list[list[tuple[str, str]]]


def decode_columns(data: bytes | memoryview, first: int, end: int) -> Columns:
    """Records ``first``..``end - 1`` of a raw fetch, into columns: the general decoder, for tuples and
    for what the compiled scan (:mod:`meshplane.spark.columnar`) does not take.

    A record cut by the fetch size ends the chunk; a bad crc or a broken sequence is an error. The
    framing is the core's :func:`~meshplane.core.streamlog.scan_records`; decoding and column extraction
    run in C (map/attrgetter).
    """
    scanned = scan_records(data, expected_offset=first, max_records=max(0, end - first))
    if scanned.problem is not None and not scanned.problem.startswith("truncated"):  # cut by the fetch
        raise RuntimeError(f"corrupt record at offset {first + len(scanned.records)} ({scanned.problem})")
    bodies = [r.payload for r in scanned.records]
    offsets = [r.offset for r in scanned.records]
    stamps = [r.timestamp_ms * 1000 for r in scanned.records]
    events = list(map(EVENT_DECODER.decode, bodies))
    datas = list(map(_DATA, events))
    metas = list(map(_METADATA, events))
    if any(metas) or not all(type(d) is str for d in datas):
        values = [_value(d, m) for d, m in zip(datas, metas, strict=True)]
        metadata = [list(m.items()) if m else [] for m in metas]
    else:  # the common case: text payloads, no metadata
        values = list(map(str.encode, datas))
        metadata = [[]] * len(events)
    return Columns(
        list(map(_KEY, events)),
        values,
        offsets,
        stamps,
        list(map(_TYPE, events)),
        list(map(_ID, events)),
        metadata,
    )


_DATA, _METADATA = operator.attrgetter("data"), operator.attrgetter("metadata")
_KEY, _TYPE, _ID = operator.attrgetter("key"), operator.attrgetter("event_type"), operator.attrgetter("id")


def to_arrow(cols: Columns, topic: str, partition: int) -> pa.RecordBatch:
    n = len(cols.offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(cols.keys, pa.string()),
            pa.array(cols.values, pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(cols.offsets, pa.int64()),
            pa.array(cols.stamps_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(cols.types, pa.string()),
            pa.array(cols.ids, pa.string()),
            pa.array(cols.metadata, pa.map_(pa.string(), pa.string())),
        ],
        schema=ARROW_SCHEMA,
    )


def to_tuples(cols: Columns, topic: str, partition: int) -> Iterator[tuple[Any, ...]]:
    for key, value, offset, stamp, event_type, event_id, meta in zip(
        cols.keys, cols.values, cols.offsets, cols.stamps_us, cols.types, cols.ids, cols.metadata, strict=True
    ):
        when = datetime.fromtimestamp(stamp / 1e6, tz=UTC)
        yield (key, value, topic, partition, offset, when, event_type, event_id, dict(meta))


def read_range(options: Options, part: TopicRange) -> Iterator[Any]:
    """Fetch [start, end) in large chunks; each chunk becomes one Arrow batch (or its rows as tuples)."""
    scan = _record_scan() if options.arrow else None
    client = options.client()
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
                lost_to = exc.next_offset
                _data_lost(options, part.topic, part.partition, offset, lost_to, "unreadable (corrupt)")
                offset = exc.next_offset
                continue
            rows, decoded = _decode(scan, data, offset, part)
            if not rows:
                raise RuntimeError(
                    f"meshplane {part.topic}/{part.partition}: no event at offset {offset} although the "
                    f"planned range ends at {part.end}: was the topic deleted and created again?"
                )
            yield from decoded
            offset += rows
    finally:
        client.close()


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
    figures). With these two settings (made for this, see
    mallopt(3)) a worker reuses the memory; it holds at most ~128 MiB it no longer uses. Elsewhere
    than glibc, nothing changes.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 128 << 20)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def _decode(
    scan: ScanToArrow | None, data: bytes | memoryview, first: int, part: TopicRange
) -> tuple[int, Iterable[Any]]:
    """One fetched chunk: (records, Arrow batches or tuples). With ``scan`` (Arrow), batches come from
    the compiled scan, or from the general decoder for chunks the scan does not take."""
    if scan is not None:
        fast = scan(data, first, part.end, part.topic, part.partition, ARROW_SCHEMA)
        if fast is not None:
            batch, rows = fast
            return rows, [batch]
    cols = decode_columns(data, first, part.end)
    if scan is not None:
        return len(cols.offsets), [to_arrow(cols, part.topic, part.partition)]
    return len(cols.offsets), to_tuples(cols, part.topic, part.partition)


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


def plan(
    options: Options, start: off.TopicOffsets, end: off.TopicOffsets, bounds: off.Bounds
) -> list[TopicRange]:
    """The Spark partitions for [start, end), checking for data deleted by retention."""
    out = []
    for topic, partition, first, until in off.ranges(off.fill_new_partitions(start, bounds), end):
        oldest = bounds[topic][str(partition)][0]
        if first < oldest:
            _data_lost(options, topic, partition, first, oldest, "deleted by retention")
            first = oldest
        if first < until:
            out.append(TopicRange(topic, partition, first, until))
    return out


class MeshplaneStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.topics = options.need_topics()
        self._client = options.client()
        self._target: off.TopicOffsets | None = None

    def _bounds(self) -> dict[str, dict[str, tuple[int, int]]]:
        return {t: self._client.bounds(t) for t in self.topics}

    @staticmethod
    def _ends(bounds: off.Bounds) -> off.TopicOffsets:
        return off.normalize({t: {p: b[1] for p, b in parts.items()} for t, parts in bounds.items()})

    def initialOffset(self) -> dict:  # type: ignore[type-arg]
        return off.resolve(self.options.starting_offsets, self._bounds(), "latest")

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_events_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends(self._bounds())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # type: ignore[type-arg]
        bounds = self._bounds()
        begin = off.fill_new_partitions(start, bounds)
        latest = off.cap(self._ends(bounds), self._target)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return off.admit(begin, latest, max_rows)

    def reportLatestOffset(self) -> dict:  # type: ignore[type-arg]
        return self._ends(self._bounds())

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:  # type: ignore[type-arg]
        return plan(self.options, start, end, self._bounds())

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TopicRange)
        return read_range(self.options, partition)

    def commit(self, end: dict) -> None:  # type: ignore[type-arg]
        """Nothing to do: the checkpoint is the position (offsets are not committed to the server)."""

    def stop(self) -> None:
        self._client.close()


class MeshplaneBatchReader(DataSourceReader):
    """Backfills: startingOffsets (default earliest) to endingOffsets (default latest)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        client = options.client()
        try:
            self.bounds = {t: client.bounds(t) for t in options.need_topics()}
        finally:
            client.close()
        self.start = off.resolve(options.starting_offsets, self.bounds, "earliest")
        self.end = off.resolve(options.ending_offsets, self.bounds, "latest")
        off.check_written(self.end, self.bounds, "endingOffsets")

    def partitions(self) -> Sequence[InputPartition]:
        return plan(self.options, self.start, self.end, self.bounds)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TopicRange)
        return read_range(self.options, partition)


# --- writing ---------------------------------------------------------------------------------------


@dataclass
class PublishedRows(WriterCommitMessage):
    rows: int


def _check_sink_schema(schema: StructType, options: Options) -> None:
    names = set(schema.fieldNames())
    if "value" not in names:
        raise ValueError(
            f"the meshplane sink needs a 'value' column (binary or string); it got {sorted(names)}"
        )
    if "topic" not in names and not options.topics:
        raise ValueError("the meshplane sink needs a 'topic' column or .option('topic', 'name')")


def _event(row: Any, options: Options) -> tuple[str, dict[str, Any]]:
    fields = row.asDict()
    value = fields.get("value")
    metadata = dict(fields.get("metadata") or {})
    if isinstance(value, bytearray | bytes):
        try:
            data: Any = bytes(value).decode()
        except UnicodeDecodeError:
            data = base64.b64encode(bytes(value)).decode()
            metadata[BASE64] = "base64"
    else:
        data = value
    event: dict[str, Any] = {"event_type": fields.get("event_type") or options.event_type, "data": data}
    if fields.get("key") is not None:
        event["key"] = str(fields["key"])
    if metadata:
        event["metadata"] = metadata
    topic = fields.get("topic") or options.topics[0]
    return str(topic), event


def publish_rows(options: Options, rows: Iterator[Any], key_prefix: str) -> PublishedRows:
    """Publish in chunks, each with an idempotency key derived from ``key_prefix`` and its number."""
    client = options.client()
    pending: dict[str, list[dict[str, Any]]] = {}
    chunk = count = 0

    def flush(topic: str) -> None:
        nonlocal chunk
        client.publish_batch(topic, pending.pop(topic), f"{key_prefix}:{topic}:{chunk}")
        chunk += 1

    try:
        for row in rows:
            topic, event = _event(row, options)
            pending.setdefault(topic, []).append(event)
            count += 1
            if len(pending[topic]) >= PUBLISH_CHUNK:
                flush(topic)
        for topic in sorted(pending):
            flush(topic)
    finally:
        client.close()
    return PublishedRows(count)


class MeshplaneStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.fallback_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        query = batch = None
        partition = 0
        if context is not None:
            query = context.getLocalProperty("sql.streaming.queryId")
            batch = context.getLocalProperty("streaming.sql.batchId")
            partition = context.partitionId()
        # The same query, batch and partition always carry the same rows: a replay is recognised.
        prefix = f"spark:{query or self.fallback_id}:{batch}:{partition}"
        return publish_rows(self.options, iterator, prefix)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, PublishedRows))
        log.info("meshplane sink: batch %d published %d rows", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "meshplane sink: batch %d aborted; a retry publishes only what was not published", batchId
        )


class MeshplaneBatchWriter(DataSourceWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # made on the driver: task retries of this write share it

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        return publish_rows(self.options, iterator, f"spark-write:{self.write_id}:{partition}")


class MeshplaneDataSource(DataSource):
    """``format("meshplane")``: see the module documentation for options."""

    @classmethod
    def name(cls) -> str:
        return "meshplane"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MeshplaneBatchReader(Options.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MeshplaneStreamReader(Options.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = Options.parse(self.options)
        _check_sink_schema(schema, options)
        return MeshplaneBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = Options.parse(self.options)
        _check_sink_schema(schema, options)
        return MeshplaneStreamWriter(options)
