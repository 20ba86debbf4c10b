"""Records of a fetch into Spark rows: the general decoder (Arrow batches or tuples) and the schema.

The compiled scan (:mod:`meshplane.spark.columnar`) takes the common case; this module takes the rest.
"""

from __future__ import annotations

import base64
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from meshplane.core.streamlog import EVENT_DECODER, scan_records

SCHEMA = (
    "key string, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "event_type string, id string, metadata map<string,string>, timestampType int"
)
HEADERS_SCHEMA = SCHEMA + ", headers array<struct<key string, value binary>>"
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
        ("timestampType", pa.int32()),
    ]
)
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))
#: Kafka's timestampType: the server stamps each event when it appends it (LogAppendTime).
LOG_APPEND_TIME = 1
BASE64 = "meshplane.encoding"  # metadata marking a value that was not UTF-8 (carried as base64)


def _value(data: Any, metadata: dict[str, str] | None) -> bytes | None:
    if data is None:
        return None  # a null value stays null (Kafka's tombstone)
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
    values: list[bytes | None]
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


def to_arrow(cols: Columns, topic: str, partition: int, schema: pa.Schema = ARROW_SCHEMA) -> pa.RecordBatch:
    n = len(cols.offsets)
    batch = pa.RecordBatch.from_arrays(
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
            pa.array(np.full(n, LOG_APPEND_TIME, np.int32)),
        ],
        schema=ARROW_SCHEMA,
    )
    return with_headers(batch) if schema is not ARROW_SCHEMA else batch


def to_tuples(cols: Columns, topic: str, partition: int, headers: bool = False) -> Iterator[tuple[Any, ...]]:
    for key, value, offset, stamp, event_type, event_id, meta in zip(
        cols.keys, cols.values, cols.offsets, cols.stamps_us, cols.types, cols.ids, cols.metadata, strict=True
    ):
        when = datetime.fromtimestamp(stamp / 1e6, tz=UTC)
        row = (key, value, topic, partition, offset, when, event_type, event_id, dict(meta), LOG_APPEND_TIME)
        yield (*row, [(k, v.encode()) for k, v in meta]) if headers else row


def with_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` plus Kafka's ``headers`` column (``array<struct<key string, value binary>>``): the
    events' metadata, which Arrow keeps in the same layout (a map is a list of key/value structs)."""
    metadata = batch.column("metadata")
    entries = pa.StructArray.from_arrays(
        [metadata.keys, metadata.items.cast(pa.binary())], names=["key", "value"]
    )
    headers = pa.ListArray.from_arrays(metadata.offsets, entries, type=HEADERS_TYPE)
    return pa.RecordBatch.from_arrays([*batch.columns, headers], schema=ARROW_SCHEMA_WITH_HEADERS)
