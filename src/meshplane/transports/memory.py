"""An in-process transport (``DYN_EVENT_PLANE=mem``): every plane of a process shares one bus.

Made for unit-testing handlers without servers (``meshplane.app``'s test plane). Events still go
through the NATS message encoding, so what a handler sees is what the wire would carry. Not a
stand-in for a real transport in their tests; the contract suite runs it as one more transport.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import MessageType, WireFormat, encode_nats
from meshplane.core.records import TRANSPORT_MEMORY
from meshplane.transports.base import PublisherTransport, Received, SubscriberTransport
from meshplane.transports.inbox import Inbox, decode_messages


class _Bus:
    def __init__(self) -> None:
        self.subscribers: defaultdict[str, set[MemorySubscriberTransport]] = defaultdict(set)

    def send(self, subject: str, data: bytes) -> None:
        for subscriber in list(self.subscribers.get(subject, ())):
            subscriber.deliver(data)


_BUS = _Bus()


class MemoryPublisherTransport(PublisherTransport):
    def __init__(self, subject: str, wire: WireFormat, codec: Codec) -> None:
        self._subject = subject
        self._wire = wire
        self._codec = codec

    async def start(self) -> None:
        return None

    def discovery_transport(self) -> tuple[str, dict[str, Any]]:
        return TRANSPORT_MEMORY, {"subject": self._subject}

    async def send(self, envelope: EventEnvelope) -> None:
        _BUS.send(self._subject, encode_nats(envelope, self._wire, self._codec))

    async def send_heartbeat(self, envelope: EventEnvelope) -> None:
        _BUS.send(self._subject, encode_nats(envelope, self._wire, self._codec, MessageType.HEARTBEAT))

    async def flush(self, timeout: float) -> None:
        return None  # delivered on send

    def subscriber_count(self) -> int:
        return len(_BUS.subscribers.get(self._subject, ()))

    async def close(self) -> None:
        return None


class MemorySubscriberTransport(SubscriberTransport):
    def __init__(self, subject: str, max_bytes: int, pending_limit: int) -> None:
        self._subject = subject
        self._routing_topic = subject.encode()
        self._max_bytes = max_bytes
        self._inbox = Inbox(pending_limit)
        self._open = False

    @property
    def drops(self) -> dict[str, int]:
        return {"queue_full": self._inbox.dropped}

    def deliver(self, data: bytes) -> None:
        self._inbox.put(data)

    def unread(self) -> bool:
        return len(self._inbox) > 0

    async def start(self) -> None:
        self._open = True
        _BUS.subscribers[self._subject].add(self)

    async def receive(self) -> list[Received]:
        batch = await self._inbox.take()
        if not self._open:
            return []
        return decode_messages(batch, self._routing_topic, self._max_bytes)[0]

    async def close(self) -> None:
        self._open = False
        _BUS.subscribers[self._subject].discard(self)
        self._inbox.wake()  # a pending receive() returns
