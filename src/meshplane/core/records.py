"""Discovery records (Dynamo's ``EventChannel`` JSON) and the file backend's key <-> file name mapping."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from meshplane.core.names import EVENT_CHANNELS_BUCKET, Scope, validate_name
from meshplane.errors import InvalidDiscoveryRecord, InvalidName

MAX_INSTANCE_ID = 2**64 - 1
MAX_RECORD_BYTES = 64 * 1024  # a real record is ~300 bytes
_FILE_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
TRANSPORT_ZMQ = "Zmq"
TRANSPORT_NATS = "Nats"
TRANSPORT_ZMQ_BROKER = "ZmqBroker"
TRANSPORT_MEMORY = "Memory"  # in-process (meshplane only; Dynamo has no such transport)


def new_instance_id() -> int:
    """A random non-zero id below 2**53 (JSON keeps it exact): publishers, subscribers, brokers."""
    return secrets.randbits(53) or 1


def publisher_identity(name: str, scope: Scope, topic: str) -> int:
    """A publisher's stable identity: the same non-zero number below 2**53 for the same instance
    ``name``, scope and topic in every process and every life, so rendezvous hashing picks the same
    brokers after a restart. (The envelope's ``publisher_id`` stays new each life: ``(publisher_id,
    sequence)`` must never repeat, or deduplicating subscribers, Dynamo's among them, drop a new life's
    events as copies of the old one's.)"""
    digest = hashlib.blake2b(f"{name}|{scope}|{topic}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") & (2**53 - 1)) or 1


@dataclass(frozen=True, slots=True)
class EventChannel:
    """One publisher of one topic, as registered in discovery."""

    scope: Scope
    topic: str
    instance_id: int
    transport_kind: str
    transport_config: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.scope.channel_key(self.topic, self.instance_id)

    @property
    def zmq_endpoint(self) -> str | None:
        endpoint = self.transport_config.get("endpoint")
        return endpoint if self.transport_kind == TRANSPORT_ZMQ and isinstance(endpoint, str) else None

    @property
    def zmq_curve_key(self) -> bytes | None:
        """The publisher's CURVE public key (Z85), when it runs with CURVE."""
        key = self.transport_config.get("curve_public_key")
        return key.encode() if isinstance(key, str) and len(key) == 40 else None

    def to_json(self) -> bytes:
        value = {
            "type": "EventChannel",
            "scope": _scope_to_json(self.scope),
            "topic": self.topic,
            "instance_id": self.instance_id,
            "transport": {"kind": self.transport_kind, "config": self.transport_config},
        }
        return json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EventChannel:
        """Parse a record, raising :class:`InvalidDiscoveryRecord` that says what is wrong."""
        if len(data) > MAX_RECORD_BYTES:
            raise InvalidDiscoveryRecord(f"record of {len(data)} bytes is larger than {MAX_RECORD_BYTES}")
        try:
            value = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise InvalidDiscoveryRecord(f"record is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise InvalidDiscoveryRecord("record is not a JSON object")
        if value.get("type") != "EventChannel":
            raise InvalidDiscoveryRecord(f"record type is {value.get('type')!r}, not 'EventChannel'")
        instance_id = value.get("instance_id")
        if type(instance_id) is not int or not 0 <= instance_id <= MAX_INSTANCE_ID:
            raise InvalidDiscoveryRecord(f"instance_id {instance_id!r} is not a u64")
        transport = value.get("transport")
        if not isinstance(transport, dict) or not isinstance(transport.get("kind"), str):
            raise InvalidDiscoveryRecord("record has no transport.kind")
        config = transport.get("config", {})
        if not isinstance(config, dict):
            raise InvalidDiscoveryRecord("transport.config is not an object")
        try:
            topic = validate_name("topic", value.get("topic"))
            scope = _scope_from_json(value.get("scope"))
        except InvalidName as exc:
            raise InvalidDiscoveryRecord(str(exc)) from exc
        return cls(scope, topic, instance_id, transport["kind"], config)


def _scope_to_json(scope: Scope) -> dict[str, Any]:
    """Dynamo 1.6.1's ``EventScope``: the endpoint's ids nested, a component's and a namespace's inline."""
    if scope.kind == "endpoint":
        endpoint = {
            "namespace": scope.namespace_name,
            "component": scope.component_name,
            "name": scope.endpoint_name,
        }
        return {"kind": "endpoint", "endpoint": endpoint}
    if scope.kind == "component":
        return {"kind": "component", "namespace": scope.namespace_name, "component": scope.component_name}
    return {"kind": "namespace", "name": scope.namespace_name}


# Where each scope kind keeps its names: (the object holding them, their keys in Scope's order).
_SCOPE_FIELDS = {
    "endpoint": ("endpoint", ("namespace", "component", "name")),
    "component": (None, ("namespace", "component")),
    "namespace": (None, ("name",)),
}
# meshplane 0.1.0 wrote these two nested like the endpoint's ({"kind": k, k: {...}}), which Dynamo
# cannot read; still read, so that its publishers are found during an upgrade
_NESTED_FIELDS = {"component": ("namespace", "name"), "namespace": ("name",)}


def _scope_from_json(value: object) -> Scope:
    if not isinstance(value, dict):
        raise InvalidDiscoveryRecord("record has no scope object")
    kind = value.get("kind")
    if not isinstance(kind, str) or kind not in _SCOPE_FIELDS:
        raise InvalidDiscoveryRecord(f"unknown scope kind {kind!r}")
    holder, fields = _SCOPE_FIELDS[kind]
    if holder is None and isinstance(value.get(kind), dict):
        holder, fields = kind, _NESTED_FIELDS[kind]
    body = value.get(holder) if holder else value
    if not isinstance(body, dict):
        raise InvalidDiscoveryRecord(f"scope kind {kind!r} has no matching body")
    return Scope(*(validate_name(f"scope.{kind}.{f}", body.get(f)) for f in fields))


def key_to_file_name(key: str) -> tuple[str, str]:
    """Split a key into (bucket folder, file name) the way Dynamo's file backend lays it out.

    The bucket is the first two segments (``v1/event_channels``); the rest becomes one file name with
    every non-alphanumeric byte written as ``%XX``.
    """
    parts = key.split("/", 2)
    if len(parts) != 3 or not parts[2]:
        raise InvalidName(f"key {key!r} has no bucket (expected e.g. {EVENT_CHANNELS_BUCKET}/...)")
    rest = "".join(chr(b) if b in _FILE_SAFE else f"%{b:02X}" for b in parts[2].encode())
    return f"{parts[0]}/{parts[1]}", rest


def file_name_to_key(bucket: str, file_name: str) -> str:
    """Invert :func:`key_to_file_name`; raises ``InvalidName`` for a name that is not an escaped key."""
    out = bytearray()
    i = 0
    while i < len(file_name):
        c = file_name[i]
        if c == "%":
            digits = file_name[i + 1 : i + 3]
            if len(digits) != 2 or any(d not in _HEX for d in digits):
                raise InvalidName(f"bad escape in discovery file name {file_name!r}")
            out.append(int(digits, 16))
            i += 3
        elif c.isascii() and c.isalnum():
            out.append(ord(c))
            i += 1
        else:
            raise InvalidName(f"unescaped {c!r} in discovery file name {file_name!r}")
    try:
        return f"{bucket}/{out.decode()}"
    except UnicodeDecodeError:
        raise InvalidName(f"discovery file name {file_name!r} is not UTF-8") from None
