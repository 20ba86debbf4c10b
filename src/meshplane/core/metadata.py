"""The ``meshplane.*`` metadata keys: the server's own, never a producer's. Pure.

``meshplane.encoding`` = ``base64`` marks data carried as base64 (bytes that are not UTF-8) and
``meshplane.headers`` holds Kafka headers that do not fit a map (repeated keys, null or binary
values), as JSON ``[[key, base64 value | null], ...]``. A producer asks for them with an event's
``encoding`` and ``headers`` fields, which the server checks before writing the entries; a
``metadata`` object naming a ``meshplane.*`` key is refused (400). Readers still decode them
defensively (:func:`decode_headers`): events stored before the keys were reserved may hold anything.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

INTERNAL_PREFIX = "meshplane."
HEADERS_KEY = "meshplane.headers"
BASE64 = "meshplane.encoding"
MAX_HEADERS_TEXT = 1 << 20  # a meshplane.headers entry longer than this is not read
MAX_HEADERS = 10_000

Header = tuple[str, bytes | None]


class MetadataError(ValueError):
    """What a producer sent that the server does not store (a 400 at the edge)."""


def reserved_key(metadata: dict[str, Any]) -> str | None:
    """The first ``meshplane.*`` key of a producer's metadata, if any."""
    return next((k for k in metadata if str(k).startswith(INTERNAL_PREFIX)), None)


def decode_headers(text: object) -> list[Header] | None:
    """The headers of a ``meshplane.headers`` entry; None when it is not a well-formed one (too long,
    nested, not base64): never raises."""
    if not isinstance(text, str) or len(text) > MAX_HEADERS_TEXT or not text.startswith("["):
        return None
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, list) or len(raw) > MAX_HEADERS:
        return None
    headers: list[Header] = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            return None
        key, value = item
        if value is None:
            headers.append((key, None))
            continue
        decoded = decode_base64(value)
        if decoded is None:
            return None
        headers.append((key, decoded))
    return headers


def decode_base64(value: object) -> bytes | None:
    """``value``'s bytes when it is strict base64 text, else None (never raises)."""
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def internal_entries(encoding: object, headers: object, data: object) -> dict[str, str]:
    """The ``meshplane.*`` entries for an event's ``encoding`` and ``headers`` fields, checked."""
    entries: dict[str, str] = {}
    if encoding is not None:
        if encoding != "base64":
            raise MetadataError(f"encoding must be 'base64' (data carried as base64), not {encoding!r}")
        if decode_base64(data) is None:
            raise MetadataError("encoding is 'base64' but data is not base64 text")
        entries[BASE64] = "base64"
    if headers is not None:
        text = json.dumps(headers, separators=(",", ":")) if isinstance(headers, list) else None
        if text is None or decode_headers(text) is None:
            raise MetadataError(
                "headers must be a list of [key, base64 value or null] (at most "
                f"{MAX_HEADERS} of them, {MAX_HEADERS_TEXT} bytes as JSON)"
            )
        entries[HEADERS_KEY] = text
    return entries
