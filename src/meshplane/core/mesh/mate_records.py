"""What HA mates keep in etcd, authenticated, sans I/O: each record carries an HMAC keyed by the
members' secret over the etcd key and the record's content, so a party that can write etcd but holds
no secret can neither point a standby at an address of its choosing nor name the mates that hold every
write. A record that fails the check is not believed (its reader counts it). Without a secret, records
carry no MAC and are read as they are (an earlier release's, or a mesh with no secret).

A signed record can still be replayed by an etcd writer (an earlier active's own address): the
standby then meets whoever is there with the mesh handshake, which only a member completes.
"""

from __future__ import annotations

import hashlib
import hmac

import msgspec


class Unreadable(ValueError):
    """Not a record at all (no mate writes that): the reader may delete it."""


class ActiveRecord(msgspec.Struct, frozen=True):
    """``active``: the active mate's token and the route address its standby dials."""

    token: str
    route: str = ""
    mac: str = ""


class CurrentRecord(msgspec.Struct, frozen=True):
    """``current``: the mates that hold every acknowledged write."""

    tokens: list[str]
    mac: str = ""


def _mac(secret: str, key: bytes, *parts: str) -> str:
    if not secret:
        return ""
    signing = hmac.new(secret.encode(), b"meshplane-mates-etcd", hashlib.sha256).digest()
    # Each part with its length: no two lists of parts (["a", "b"] and ["a\x00b"]) sign alike.
    message = b"".join(len(p).to_bytes(4, "big") + p for p in (key, *(part.encode() for part in parts)))
    return hmac.new(signing, message, hashlib.sha256).hexdigest()


def _check(secret: str, key: bytes, mac: str, *parts: str) -> None:
    if secret and not hmac.compare_digest(_mac(secret, key, *parts), mac):
        raise ValueError("its MAC does not match (written without the members' secret)")


def encode_active(secret: str, key: bytes, token: str, route: str = "") -> bytes:
    return msgspec.json.encode(ActiveRecord(token, route, _mac(secret, key, token, route)))


def decode_active(secret: str, key: bytes, value: bytes) -> ActiveRecord:
    """ValueError unless ``value`` is a well-formed ``active`` record whose MAC is right."""
    try:
        record = msgspec.json.decode(value, type=ActiveRecord)
    except msgspec.DecodeError as exc:
        raise Unreadable(f"not an active record ({exc})") from None
    _check(secret, key, record.mac, record.token, record.route)
    return record


def encode_current(secret: str, key: bytes, tokens: list[str]) -> bytes:
    return msgspec.json.encode(CurrentRecord(tokens, _mac(secret, key, *tokens)))


def decode_current(secret: str, key: bytes, value: bytes) -> list[str]:
    """The tokens of a well-formed ``current`` record whose MAC is right, else ValueError. An earlier
    release's bare list is read only without a secret."""
    try:
        if value.startswith(b"["):
            if secret:
                raise ValueError("an earlier release's record, with no MAC")
            return msgspec.json.decode(value, type=list[str])
        record = msgspec.json.decode(value, type=CurrentRecord)
    except msgspec.DecodeError as exc:
        raise Unreadable(f"not a current record ({exc})") from None
    _check(secret, key, record.mac, *record.tokens)
    return record.tokens
