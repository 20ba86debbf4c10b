"""Events as read back, and how readers waiting for new ones are woken."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from meshplane.core import streamlog
from meshplane.core.keys import key_to_json
from meshplane.core.streamlog import StoredEvent, decode_event, encode_event
from meshplane.streams.errors import BadRequest, PayloadTooLarge


@dataclass(slots=True)
class StreamEvent:
    """An event as read back: its place (offset, partition) and what was published."""

    offset: int
    timestamp_ms: int
    body: StoredEvent
    size: int = 0
    partition: int | None = None
    rendered: dict[str, bytes] | None = None  # frames built once and sent to every pushed subscriber

    def render(self, kind: str, build: Callable[[StreamEvent], bytes]) -> bytes:
        if self.rendered is None:
            self.rendered = {}
        frame = self.rendered.get(kind)
        if frame is None:
            frame = self.rendered[kind] = build(self)
        return frame

    def room_json(self, room: str) -> dict[str, Any]:
        return {
            "id": self.body.id,
            "offset": self.offset,
            "room": room,
            "event": self.body.event_type,
            "event_type": self.body.event_type,
            "type": self.body.event_type,
            "data": self.body.data,
            "timestamp": self.timestamp_ms // 1000,
            "timestamp_ms": self.timestamp_ms,
            "metadata": self.body.metadata or {},
        }

    def topic_json(self, topic: str) -> dict[str, Any]:
        return {
            "id": self.body.id,
            "partition_id": self.partition,
            "offset": self.offset,
            "topic": topic,
            "event_type": self.body.event_type,
            **key_to_json(self.body.key),
            "data": self.body.data,
            "timestamp": self.timestamp_ms // 1000,
            "timestamp_ms": self.timestamp_ms,
            "metadata": self.body.metadata or {},
            "size_bytes": self.size,
        }


def decode_stream_event(record: streamlog.Record, partition: int | None = None) -> StreamEvent:
    return StreamEvent(
        record.offset, record.timestamp_ms, decode_event(record.payload), record.size, partition
    )


class Notifier:
    """Wakes readers waiting for new events (pushed subscribers, long polls)."""

    def __init__(self) -> None:
        self._events: set[asyncio.Event] = set()

    def waiter(self) -> asyncio.Event:
        event = asyncio.Event()
        self._events.add(event)
        return event

    def forget(self, event: asyncio.Event) -> None:
        self._events.discard(event)

    def notify(self) -> None:
        for event in self._events:
            event.set()

    def __len__(self) -> int:
        return len(self._events)


def encode_checked(event: StoredEvent, limit: int) -> bytes:
    """The event as stored; a 400 for what cannot be encoded, a 413 past ``limit`` bytes."""
    try:
        payload = encode_event(event)
    except (OverflowError, msgspec.EncodeError) as exc:
        raise BadRequest(f"event cannot be stored: {exc} (integers must fit in 64 bits)") from None
    if len(payload) > limit:
        raise PayloadTooLarge(f"event of {len(payload)} bytes is larger than the limit of {limit} bytes")
    return payload
