"""The write side of ``format("meshplane")``: Kafka's sink contract over the streams API.

Columns: ``value`` (binary or string; null stays null), optional ``key``, ``topic`` (the ``topic``
option wins, as in Kafka), ``partition``, ``headers`` (``array<struct<key string, value binary>>``,
stored as the events' metadata), ``event_type`` and ``metadata``. A missing topic is created with the
server's default partitions, as Kafka's brokers do. Rows are published in chunks, each
with an idempotency key per (query, batchId, partition, chunk): a replayed batch publishes nothing
twice.
"""

from __future__ import annotations

import base64
import logging
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

from meshplane.errors import Conflict, NotFound
from meshplane.spark.headers import BASE64, to_metadata
from meshplane.spark.http import SyncStreamsClient
from meshplane.spark.options import Options, SparkOptionError
from meshplane.spark.reader import open_client

log = logging.getLogger(__name__)
PUBLISH_CHUNK = 1000
_TEXT_OR_BYTES = (StringType, BinaryType)


@dataclass
class PublishedRows(WriterCommitMessage):
    rows: int


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


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytearray | bytes):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            raise SparkOptionError(f"{what} is not UTF-8 text: {bytes(value)[:40]!r}") from None
    return str(value)


def row_to_event(row: Any, options: Options) -> tuple[str, int | None, dict[str, Any]]:
    """(topic, partition or None, event) for one row."""
    fields = row.asDict(recursive=True)
    value = fields.get("value")
    metadata = {str(k): str(v) for k, v in (fields.get("metadata") or {}).items()}
    # Beside a metadata column, headers are stored whole: read back, they are not mixed with its entries.
    headers = ((h["key"], h["value"]) for h in fields.get("headers") or ())
    metadata.update(to_metadata(headers, plain=not metadata))
    data: Any
    if isinstance(value, bytearray | bytes):
        try:
            data = bytes(value).decode()
        except UnicodeDecodeError:
            data = base64.b64encode(bytes(value)).decode()
            metadata[BASE64] = "base64"
    else:
        data = value  # text, null, or (valueFormat=json) a number, list or struct with its field names
    event: dict[str, Any] = {"event_type": fields.get("event_type") or options.event_type, "data": data}
    if fields.get("key") is not None:
        event["key"] = _text(fields["key"], "the key")
    if metadata:
        event["metadata"] = metadata
    topic = options.topics[0] if options.topics else fields.get("topic")
    if not topic:
        raise SparkOptionError("a row has no topic: set the topic column or .option('topic', 'name')")
    partition = fields.get("partition")
    return str(topic), None if partition is None else int(partition), event


def publish_rows(options: Options, rows: Iterator[Any], key_prefix: str) -> PublishedRows:
    """Publish in chunks, each with an idempotency key derived from ``key_prefix`` and its number."""
    client = open_client(options)
    pending: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    chunk = count = 0

    def flush(place: tuple[str, int | None]) -> None:
        nonlocal chunk
        topic, partition = place
        events, key = pending.pop(place), f"{key_prefix}:{topic}:{chunk}"
        try:
            client.publish_batch(topic, events, key, partition)
        except NotFound:
            _create(client, topic)
            client.publish_batch(topic, events, key, partition)  # a 404 again: it was about something else
        chunk += 1

    try:
        for row in rows:
            topic, partition, event = row_to_event(row, options)
            batch = pending.setdefault((topic, partition), [])
            batch.append(event)
            count += 1
            if len(batch) >= PUBLISH_CHUNK:
                flush((topic, partition))
        for place in sorted(pending, key=lambda p: (p[0], -1 if p[1] is None else p[1])):
            flush(place)
    finally:
        client.close()
    return PublishedRows(count)


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
