"""Kafka record headers <-> an event's metadata. Pure: no Spark, no I/O.

Kafka headers are an ordered list of (string key, bytes value or null) where keys repeat; metadata is
a string -> string map other clients read. Headers that fit a map (unique UTF-8 keys, non-null UTF-8
values) are stored as plain metadata entries, readable by every client; any others are stored whole,
exactly, in one ``meshplane.headers`` entry. Keys starting with ``meshplane.`` are meshplane's own
(``meshplane.encoding`` marks a value carried as base64) and are never read back as headers.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping

from meshplane.core.metadata import BASE64, HEADERS_KEY, INTERNAL_PREFIX, Header, decode_headers

__all__ = ["BASE64", "HEADERS_KEY", "from_metadata", "header_key", "to_metadata"]


def header_key(key: str | bytes | bytearray) -> str:
    """A header key as text: Kafka's keys are strings (bytes that are not UTF-8 are replaced, as the
    Java client's String does)."""
    return bytes(key).decode(errors="replace") if isinstance(key, bytes | bytearray) else str(key)


def _plain(headers: list[Header]) -> dict[str, str] | None:
    """The headers as a metadata map, or None when a map would change them."""
    plain: dict[str, str] = {}
    for key, value in headers:
        if value is None or key in plain or key.startswith(INTERNAL_PREFIX):
            return None
        try:
            plain[key] = value.decode()
        except UnicodeDecodeError:
            return None
    return plain


def to_metadata(
    headers: Iterable[tuple[str | bytes | bytearray, bytes | bytearray | str | None]], plain: bool = True
) -> dict[str, str]:
    """The metadata entries that carry ``headers`` exactly (order, repeats, nulls, any bytes): plain
    entries when they fit a map and ``plain``, else one ``meshplane.headers`` entry."""
    listed: list[Header] = [
        (header_key(k), None if v is None else v.encode() if isinstance(v, str) else bytes(v))
        for k, v in headers
    ]
    if not listed:
        return {}
    as_map = _plain(listed) if plain else None
    if as_map is not None:
        return as_map
    encoded = [[k, None if v is None else base64.b64encode(v).decode()] for k, v in listed]
    return {HEADERS_KEY: json.dumps(encoded, separators=(",", ":"))}


def from_metadata(metadata: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[Header]:
    """The headers an event's metadata carries: its ``meshplane.headers`` entry when it has one, else
    its entries (written by any client) in order, meshplane's own left out."""
    items = list(metadata.items() if isinstance(metadata, Mapping) else metadata)
    for key, value in items:
        if key == HEADERS_KEY:
            decoded = decode_headers(value)  # bounded, never raises: a malformed entry is left out
            if decoded is not None:
                return decoded
    return [(k, v.encode()) for k, v in items if not k.startswith(INTERNAL_PREFIX)]


def malformed(metadata: Mapping[str, str] | Iterable[tuple[str, str]]) -> bool:
    """Whether an event's ``meshplane.headers`` entry cannot be read (its headers are then its plain
    entries)."""
    items = metadata.items() if isinstance(metadata, Mapping) else metadata
    return any(k == HEADERS_KEY and decode_headers(v) is None for k, v in items)
