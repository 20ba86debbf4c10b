"""Event keys in the JSON APIs. Pure.

A key is text, or (as Kafka's) any bytes. The log keeps bytes that are not UTF-8 as msgpack bin and
everything else as text, so a key has one stored form and routes by ``crc32`` of its bytes either way.
In JSON a text key is ``key`` (as Synap's); one that is not UTF-8 is ``key_base64`` beside
``"key": null``, so a client that knows only ``key`` sees an event without a key, never a wrong one.
A producer may send either field (not both); ``key_base64`` of UTF-8 bytes is stored as the text.
"""

from __future__ import annotations

import base64
from typing import Any

from meshplane.core.metadata import MetadataError, decode_base64


def key_from_json(source: dict[str, Any]) -> str | bytes | None:
    """The key a producer's ``key`` or ``key_base64`` field gives, as stored; raises MetadataError."""
    key, raw = source.get("key"), source.get("key_base64")
    if raw is None:
        if key is not None and not isinstance(key, str):
            raise MetadataError(f"key must be a string, not {key!r} (bytes: key_base64)")
        return key
    if key is not None:
        raise MetadataError("key and key_base64 both given: send one")
    decoded = decode_base64(raw)
    if decoded is None:
        raise MetadataError(f"key_base64 is not base64 text: {str(raw)[:40]!r}")
    return stored_key(decoded)


def stored_key(key: bytes) -> str | bytes:
    """The form the log keeps ``key`` in: its text when it is UTF-8."""
    try:
        return key.decode()
    except UnicodeDecodeError:
        return key


def key_to_json(key: str | bytes | None) -> dict[str, Any]:
    """The JSON fields of a stored key."""
    if isinstance(key, bytes):
        return {"key": None, "key_base64": base64.b64encode(key).decode()}
    return {"key": key}
