"""Scopes, name validation, NATS subjects and discovery keys (Dynamo 1.6.1 layout)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from meshplane.errors import InvalidName

MAX_NAME_BYTES = 255
# '.', '*' and '>' are NATS subject syntax and '/' separates discovery key segments, so a
# name holding one of them would address something else on one of the transports.
_FORBIDDEN = re.compile(r"[\s.*>/\\\x00-\x1f\x7f]")
_KEY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
EVENT_CHANNELS_BUCKET = "v1/event_channels"
SUBSCRIBERS_BUCKET = "v1/event_subscribers"  # meshplane's own; Dynamo watches only event_channels

ScopeKind = Literal["namespace", "component", "endpoint"]


def validate_name(what: str, value: object) -> str:
    """Return ``value`` if it is usable as a namespace/component/endpoint/topic name."""
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidName(f"{what} must not be empty")
    if len(value.encode()) > MAX_NAME_BYTES:
        raise InvalidName(f"{what} {value[:40]!r}... is longer than {MAX_NAME_BYTES} bytes")
    bad = _FORBIDDEN.search(value)
    if bad:
        raise InvalidName(
            f"{what} {value!r} contains {bad.group()!r}; names may not contain whitespace, "
            "control characters or any of . * > / \\"
        )
    return value


def encode_key_segment(segment: str) -> str:
    """Percent-encode every byte outside ``[A-Za-z0-9_-]``, as Dynamo does for key segments."""
    return "".join(chr(b) if b in _KEY_SAFE else f"%{b:02X}" for b in segment.encode())


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a topic lives: a namespace, a component of it, or an endpoint of a component.

    Build one with :meth:`Scope.endpoint`, :meth:`Scope.component` or :meth:`Scope.namespace`.
    """

    namespace_name: str
    component_name: str | None = None
    endpoint_name: str | None = None

    def __post_init__(self) -> None:
        validate_name("namespace", self.namespace_name)
        if self.component_name is not None:
            validate_name("component", self.component_name)
        if self.endpoint_name is not None:
            if self.component_name is None:
                raise InvalidName("an endpoint scope needs a component")
            validate_name("endpoint", self.endpoint_name)

    @classmethod
    def endpoint(cls, namespace: str, component: str, endpoint: str) -> Scope:
        return cls(namespace, component, endpoint)

    @classmethod
    def component(cls, namespace: str, component: str) -> Scope:
        return cls(namespace, component)

    @classmethod
    def namespace(cls, namespace: str) -> Scope:
        return cls(namespace)

    @classmethod
    def parse(cls, text: str) -> Scope:
        """Parse ``ns``, ``ns/comp`` or ``ns/comp/endpoint`` (the CLI's spelling)."""
        parts = text.split("/")
        if not 1 <= len(parts) <= 3:
            raise InvalidName(f"scope {text!r} must be ns, ns/component or ns/component/endpoint")
        return cls(*parts)

    @property
    def kind(self) -> ScopeKind:
        if self.endpoint_name is not None:
            return "endpoint"
        if self.component_name is not None:
            return "component"
        return "namespace"

    @property
    def subject_prefix(self) -> str:
        """The NATS subject prefix, e.g. ``namespace.ns.component.c.endpoint.e``."""
        prefix = f"namespace.{self.namespace_name}"
        if self.component_name is not None:
            prefix += f".component.{self.component_name}"
        if self.endpoint_name is not None:
            prefix += f".endpoint.{self.endpoint_name}"
        return prefix

    def subject(self, topic: str) -> str:
        return f"{self.subject_prefix}.{topic}"

    @property
    def key_prefix(self) -> str:
        key = f"{EVENT_CHANNELS_BUCKET}/namespace/{encode_key_segment(self.namespace_name)}"
        if self.component_name is not None:
            key += f"/component/{encode_key_segment(self.component_name)}"
        if self.endpoint_name is not None:
            key += f"/endpoint/{encode_key_segment(self.endpoint_name)}"
        return key

    def channel_prefix(self, topic: str) -> str:
        """The discovery key prefix under which every publisher of ``topic`` registers."""
        return f"{self.key_prefix}/topic/{encode_key_segment(topic)}/"

    def channel_key(self, topic: str, instance_id: int) -> str:
        return f"{self.channel_prefix(topic)}{instance_id:x}"

    def subscriber_prefix(self, topic: str) -> str:
        """Where subscribers that announce themselves register (NATS: nothing else tells a publisher)."""
        return SUBSCRIBERS_BUCKET + self.channel_prefix(topic)[len(EVENT_CHANNELS_BUCKET) :]

    def __str__(self) -> str:
        return "/".join(p for p in (self.namespace_name, self.component_name, self.endpoint_name) if p)
