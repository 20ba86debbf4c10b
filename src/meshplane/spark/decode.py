"""Records of a fetch into Spark rows: the general decoder (Arrow batches or tuples) and the schema.

The compiled scan (:mod:`meshplane.spark.columnar`) takes the common case; this module takes the rest.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from meshplane.core.metadata import BASE64, INTERNAL_PREFIX, decode_base64
from meshplane.core.streamlog import EVENT_DECODER, scan_records
from meshplane.spark.headers import from_metadata, malformed

#: Kafka's columns, names, types and order, then meshplane's own (``columns=kafka``, the default).
KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
OWN_COLUMNS = ["event_type", "id", "metadata"]
#: The order before Kafka's (``columns=legacy``): a string key, meshplane's columns in between.
LEGACY_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", *OWN_COLUMNS, "timestampType"]
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_TYPES = {
    "value": pa.binary(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestampType": pa.int32(),
    "headers": HEADERS_TYPE,
    "event_type": pa.string(),
    "id": pa.string(),
    "metadata": pa.map_(pa.string(), pa.string()),
}


def arrow_schema(kafka: bool = True, headers: bool = False) -> pa.Schema:
    """The source's columns: Kafka's (binary key), ``headers`` after them with ``includeHeaders``
    (where Kafka puts it), then meshplane's; or the legacy order (a string key, headers last)."""
    if kafka:
        names = [*KAFKA_COLUMNS, *(["headers"] if headers else []), *OWN_COLUMNS]
    else:
        names = [*LEGACY_COLUMNS, *(["headers"] if headers else [])]
    key = pa.binary() if kafka else pa.string()
    return pa.schema([(name, key if name == "key" else _TYPES[name]) for name in names])


def spark_schema(schema: pa.Schema) -> str:
    """``schema`` in Spark's DDL, for ``DataSource.schema()``."""
    return ", ".join(f"{field.name} {_DDL[field.type]}" for field in schema)


def column_types(schema: pa.Schema) -> list[tuple[str, str]]:
    """(name, Spark's ``simpleString`` of its type) of each column, to compare with a user's schema."""
    simple = {
        "long": "bigint",
        "array<struct<key string, value binary>>": "array<struct<key:string,value:binary>>",
    }
    return [(f.name, simple.get(_DDL[f.type], _DDL[f.type])) for f in schema]


_DDL = {
    pa.binary(): "binary",
    pa.string(): "string",
    pa.int32(): "int",
    pa.int64(): "long",
    _TYPES["timestamp"]: "timestamp",
    HEADERS_TYPE: "array<struct<key string, value binary>>",
    _TYPES["metadata"]: "map<string,string>",
}


log = logging.getLogger(__name__)
ARROW_SCHEMA = arrow_schema()
#: Kafka's timestampType: the server stamps each event when it appends it (LogAppendTime).
LOG_APPEND_TIME = 1


def _value(data: Any, metadata: dict[str, str] | None) -> bytes | None:
    if data is None:
        return None  # a null value stays null (Kafka's tombstone)
    if metadata and metadata.get(BASE64) == "base64" and isinstance(data, str):
        decoded = decode_base64(data)
        if decoded is not None:
            return decoded
        # Not base64 after all (stored before the key was the server's): the text as it is.
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    return msgspec.json.encode(data)


@dataclass
class Columns:
    """Decoded records of one fetch, column by column."""

    keys: list[str | bytes | None]  # bytes: a key that is not UTF-8
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
        _count_malformed(datas, metas, offsets)
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


def _count_malformed(datas: list[Any], metas: list[dict[str, str] | None], offsets: list[int]) -> None:
    """Say how many events carry ``meshplane.*`` entries that cannot be read: they are delivered with
    what can be (the value's text, the plain metadata as headers), never failing the chunk."""
    bad = [
        o
        for d, m, o in zip(datas, metas, offsets, strict=True)
        if m
        and any(k.startswith(INTERNAL_PREFIX) for k in m)
        and ((m.get(BASE64) == "base64" and isinstance(d, str) and decode_base64(d) is None) or malformed(m))
    ]
    if bad:
        MALFORMED[0] += len(bad)
        log.warning(
            "meshplane: %d events with unreadable meshplane.* metadata (offsets %d..%d) delivered as read "
            "(%d so far in this process)",
            len(bad),
            bad[0],
            bad[-1],
            MALFORMED[0],
        )


MALFORMED = [0]  # events with unreadable meshplane.* metadata decoded by this process
_DATA, _METADATA = operator.attrgetter("data"), operator.attrgetter("metadata")
_KEY, _TYPE, _ID = operator.attrgetter("key"), operator.attrgetter("event_type"), operator.attrgetter("id")


def to_arrow(cols: Columns, topic: str, partition: int, schema: pa.Schema = ARROW_SCHEMA) -> pa.RecordBatch:
    n = len(cols.offsets)
    columns = {
        "key": _key_column(cols.keys, schema.field("key").type),
        "value": pa.array(cols.values, pa.binary()),
        "topic": pa.array([topic] * n, pa.string()),
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(cols.offsets, pa.int64()),
        "timestamp": pa.array(cols.stamps_us, pa.int64()).cast(_TYPES["timestamp"]),
        "timestampType": pa.array(np.full(n, LOG_APPEND_TIME, np.int32)),
        "event_type": pa.array(cols.types, pa.string()),
        "id": pa.array(cols.ids, pa.string()),
        "metadata": pa.array(cols.metadata, _TYPES["metadata"]),
    }
    if "headers" in schema.names:
        # A record without headers: null, as Kafka's KafkaRecordToRowConverter gives
        columns["headers"] = pa.array([from_metadata(m) or None for m in cols.metadata], HEADERS_TYPE)
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


_TEXT_KEYS: set[type] = {str, type(None)}
_ANY_KEYS: set[type] = {str, bytes, type(None)}


def _key_column(keys: list[str | bytes | None], kind: pa.DataType) -> pa.Array:
    """Keys are text, or bytes where they are not UTF-8 (core.keys): binary as Kafka's column; in a
    string column (``columns=legacy``) such bytes read with U+FFFD, as header keys do."""
    kinds = set(map(type, keys))
    if kinds <= _TEXT_KEYS:
        return pa.array(keys, pa.string()).cast(kind)
    if not kinds <= _ANY_KEYS:  # not written by a meshplane server
        raise RuntimeError(
            f"an event key is {sorted(k.__name__ for k in kinds - _ANY_KEYS)}, not text or bytes"
        )
    return pa.array([_key(k, kind == pa.binary()) for k in keys], kind)


def _key(key: str | bytes | None, binary: bool) -> str | bytes | None:
    if binary:
        return key.encode() if type(key) is str else key
    return key.decode(errors="replace") if type(key) is bytes else key


def to_tuples(cols: Columns, topic: str, partition: int, schema: pa.Schema) -> Iterator[tuple[Any, ...]]:
    binary_key = schema.field("key").type == pa.binary()
    for key, value, offset, stamp, event_type, event_id, meta in zip(
        cols.keys, cols.values, cols.offsets, cols.stamps_us, cols.types, cols.ids, cols.metadata, strict=True
    ):
        row = {
            "key": _key(key, binary_key),
            "value": value,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "timestamp": datetime.fromtimestamp(stamp / 1e6, tz=UTC),
            "timestampType": LOG_APPEND_TIME,
            "event_type": event_type,
            "id": event_id,
            "metadata": dict(meta),
        }
        if "headers" in schema.names:
            row["headers"] = from_metadata(meta) or None
        yield tuple(row[name] for name in schema.names)


def empty_headers(rows: int) -> pa.Array:
    """A ``headers`` column for ``rows`` events without metadata: null, as Kafka's for no headers."""
    return pa.nulls(rows, HEADERS_TYPE)
