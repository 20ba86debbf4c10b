"""The write side of ``format("meshplane")``: Kafka's sink contract over the streams API.

Columns: ``value`` (binary or string; null stays null), optional ``key``, ``topic`` (the ``topic``
option wins, as in Kafka), ``partition``, ``headers`` (``array<struct<key string, value binary>>``,
stored as the events' metadata), ``event_type`` and ``metadata``. A missing topic is created with the
server's default partitions, as Kafka's brokers do.

Exactly once by Spark's commit protocol, never by row order: each task attempt stages its rows on the
server under a stage id of its own and returns it in its commit message; the driver's ``commit()``
appends exactly the committed attempts' stages, per topic in one append (all-or-nothing across its
partitions) under the key ``spark:<queryId>:<batchId>``, so a batch committed before a driver crash
and run again appends nothing; ``abort()`` drops the stages, and those of attempts that died expire
on the server.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

from meshplane.core.keys import stored_key
from meshplane.errors import Conflict, MeshplaneError, NotFound
from meshplane.spark.headers import HEADERS_KEY, to_metadata
from meshplane.spark.http import SyncStreamsClient
from meshplane.spark.options import Options, SparkOptionError
from meshplane.spark.reader import open_client

log = logging.getLogger(__name__)
PUBLISH_CHUNK = 1000
_TEXT_OR_BYTES = (StringType, BinaryType)


@dataclass
class StagedRows(WriterCommitMessage):
    """A task attempt's commit message: its stage, and per topic the chunks and rows it staged."""

    partition: int  # Spark's partition: the commit appends stages in this order
    stage: str
    topics: dict[str, tuple[int, int]]
    query: str | None


def check_sink_schema(schema: StructType, options: Options) -> None:
    """Refuse, at save() / start(), what the sink would otherwise mangle."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise SparkOptionError(
            f"the meshplane sink needs a 'value' column (binary or string); it got {sorted(fields)}"
        )
    if not isinstance(fields["value"], _TEXT_OR_BYTES) and options.value_format != "json":
        raise SparkOptionError(
            f"the meshplane sink's value column is {fields['value'].simpleString()}; cast it to string or "
            "binary, or set valueFormat=json to send it as JSON"
        )
    if "topic" not in fields and not options.topics:
        raise SparkOptionError("the meshplane sink needs a 'topic' column or .option('topic', 'name')")
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers, ArrayType)
        and isinstance(headers.elementType, StructType)
        and {f.name: type(f.dataType) for f in headers.elementType.fields}.keys() == {"key", "value"}
        and all(isinstance(f.dataType, _TEXT_OR_BYTES) for f in headers.elementType.fields)
    ):
        raise SparkOptionError(
            f"the meshplane sink's headers column must be array<struct<key string, value binary>>, not "
            f"{headers.simpleString()}"
        )


def row_to_event(row: Any, options: Options) -> tuple[str, int | None, dict[str, Any]]:
    """(topic, partition or None, event) for one row."""
    fields = row.asDict(recursive=True)
    value = fields.get("value")
    metadata = {str(k): str(v) for k, v in (fields.get("metadata") or {}).items()}
    # Beside a metadata column, headers are stored whole: read back, they are not mixed with its entries.
    headers = ((h["key"], h["value"]) for h in fields.get("headers") or ())
    entries = to_metadata(headers, plain=not metadata)
    whole = entries.pop(HEADERS_KEY, None)  # the server writes meshplane.* entries: asked by field
    metadata.update(entries)
    data: Any
    event: dict[str, Any] = {"event_type": fields.get("event_type") or options.event_type}
    if isinstance(value, bytearray | bytes):
        try:
            data = bytes(value).decode()
        except UnicodeDecodeError:
            data = base64.b64encode(bytes(value)).decode()
            event["encoding"] = "base64"
    else:
        data = value  # text, null, or (valueFormat=json) a number, list or struct with its field names
    event["data"] = data
    if whole is not None:
        event["headers"] = json.loads(whole)
    key = fields.get("key")
    if isinstance(key, bytearray | bytes):  # any bytes, as Kafka's: stored exactly (core.keys)
        key = stored_key(bytes(key))
        if isinstance(key, bytes):
            event["key_base64"] = base64.b64encode(key).decode()
        else:
            event["key"] = key
    elif key is not None:
        event["key"] = str(key)
    if metadata:
        event["metadata"] = metadata
    topic = options.topics[0] if options.topics else fields.get("topic")
    if not topic:
        raise SparkOptionError("a row has no topic: set the topic column or .option('topic', 'name')")
    partition = fields.get("partition")
    return str(topic), None if partition is None else int(partition), event


def stage_rows(options: Options, rows: Iterator[Any], partition: int, query: str | None) -> StagedRows:
    """Stage a task attempt's rows on the server, per topic, in chunks numbered from 0, under a stage
    id of this attempt alone: nothing is visible until the driver commits the message returned."""
    client = open_client(options)
    stage = uuid.uuid4().hex
    pending: dict[str, list[dict[str, Any]]] = {}
    staged: dict[str, list[int]] = {}  # topic -> [chunks, events]

    def flush(topic: str) -> None:
        events, done = pending.pop(topic), staged.setdefault(topic, [0, 0])
        try:
            client.stage(topic, stage, done[0], events)
        except NotFound:
            _create(client, topic)
            client.stage(topic, stage, done[0], events)  # a 404 again: it was about something else
        done[0] += 1
        done[1] += len(events)

    try:
        for row in rows:
            topic, place, event = row_to_event(row, options)
            if place is not None:
                event["partition"] = place
            batch = pending.setdefault(topic, [])
            batch.append(event)
            if len(batch) >= PUBLISH_CHUNK:
                flush(topic)
        for topic in sorted(pending):
            flush(topic)
    finally:
        client.close()
    return StagedRows(partition, stage, {t: (c, e) for t, (c, e) in staged.items()}, query)


def commit_staged(options: Options, messages: list[WriterCommitMessage | None], key: str) -> int:
    """Make exactly the committed attempts' rows visible, per topic in one append under ``key``
    (a batch committed before appends nothing); returns the rows committed now."""
    staged = sorted((m for m in messages if isinstance(m, StagedRows)), key=lambda m: m.partition)
    topics = sorted({t for m in staged for t in m.topics})
    client = open_client(options)
    rows = 0
    try:
        for topic in topics:
            stages: list[dict[str, Any]] = [
                {"stage": m.stage, "chunks": m.topics[topic][0], "events": m.topics[topic][1]}
                for m in staged
                if topic in m.topics
            ]
            if client.commit_staged(topic, key, stages):
                rows += sum(s["events"] for s in stages)
    finally:
        client.close()
    return rows


def abort_staged(options: Options, messages: list[WriterCommitMessage | None]) -> None:
    """Drop what the attempts staged (what is not dropped expires on the server)."""
    staged = [m for m in messages if isinstance(m, StagedRows)]
    client = open_client(options)
    try:
        for topic in sorted({t for m in staged for t in m.topics}):
            try:
                client.abort_staged(topic, [m.stage for m in staged if topic in m.topics])
            except MeshplaneError as exc:
                log.warning(
                    "meshplane sink: staged rows of topic %r not dropped (%s); they expire", topic, exc
                )
    finally:
        client.close()


def _create(client: SyncStreamsClient, topic: str) -> None:
    """Make a missing topic with the server's default partitions, as Kafka's brokers do by default
    (``auto.create.topics.enable``). A conflict is another task of the query that made it first."""
    try:
        client.json("POST", f"/topics/{urllib.parse.quote(topic, safe='')}", {})
    except Conflict:
        return
    log.info("meshplane sink: created topic %r", topic)


class MeshplaneStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.fallback_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        query, partition = None, 0
        if context is not None:
            query = context.getLocalProperty("sql.streaming.queryId")
            partition = context.partitionId()
        return stage_rows(self.options, iterator, partition, query)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The query's id outlives driver restarts (it is in the checkpoint): a batch run again after
        # a crash commits under the same key, and appends nothing if its first run had committed.
        queries = {m.query for m in messages if isinstance(m, StagedRows)}
        query = next(iter(queries)) if len(queries) == 1 else None
        rows = commit_staged(self.options, messages, f"spark:{query or self.fallback_id}:{batchId}")
        log.info("meshplane sink: batch %d committed %d rows", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("meshplane sink: batch %d aborted; its staged rows are dropped", batchId)
        abort_staged(self.options, messages)


class MeshplaneBatchWriter(DataSourceWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # made on the driver: its commit's key

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        return stage_rows(self.options, iterator, partition, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_staged(self.options, messages, f"spark-write:{self.write_id}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_staged(self.options, messages)
