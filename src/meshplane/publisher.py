"""``EventPublisher``: publish events on one topic of one scope; registered in discovery while open."""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from meshplane.config import PlaneConfig
from meshplane.core.envelope import EventEnvelope
from meshplane.core.names import Scope, validate_name
from meshplane.core.records import EventChannel, new_instance_id
from meshplane.discovery import Discovery
from meshplane.errors import ClosedError, MeshplaneError, PayloadTooLarge
from meshplane.transports.base import PublisherTransport

if TYPE_CHECKING:
    from meshplane.plane import EventPlane

log = logging.getLogger(__name__)
_encode_payload = msgspec.msgpack.Encoder().encode


class EventPublisher:
    """Publishes events on ``topic`` in ``scope``.

    ``await EventPublisher.create(scope, topic)`` binds or connects the transport and registers the
    publisher in discovery; ``close()`` (or leaving ``async with``) unregisters it.
    """

    def __init__(
        self,
        scope: Scope,
        topic: str,
        publisher_id: int,
        plane: EventPlane,
        transport: PublisherTransport,
        discovery: Discovery | None,
        owns_plane: bool,
    ) -> None:
        self.scope = scope
        self.topic = topic
        self.publisher_id = publisher_id
        self.plane = plane
        self._transport = transport
        self._discovery = discovery
        self._owns_plane = owns_plane
        self._max_bytes = plane.config.max_message_bytes
        self._sequence = 0
        self._closed = False
        registration = transport.discovery_transport()
        #: The discovery record; None where the transport registers no publishers (broker mode).
        self.channel = EventChannel(scope, topic, publisher_id, *registration) if registration else None

    @classmethod
    async def create(
        cls,
        scope: Scope,
        topic: str,
        *,
        plane: EventPlane | None = None,
        config: PlaneConfig | None = None,
    ) -> EventPublisher:
        """Create a publisher; without ``plane`` it gets a private one (configured from ``config``/env)."""
        validate_name("topic", topic)
        owns_plane = plane is None
        if plane is None:
            from meshplane.plane import EventPlane  # the plane makes members; only here the reverse

            plane = EventPlane(config)
        transport: PublisherTransport | None = None
        try:
            publisher_id = new_instance_id()
            transport = await plane.publisher_transport(scope, topic, publisher_id)
            registers = transport.discovery_transport() is not None
            discovery = await plane.discovery() if registers else None
            publisher = cls(scope, topic, publisher_id, plane, transport, discovery, owns_plane)
            if discovery is not None and publisher.channel is not None:
                await discovery.register(publisher.channel.key, publisher.channel.to_json())
        except BaseException:
            if transport is not None:
                await transport.close()
            if owns_plane:
                await plane.close()
            raise
        plane._adopt(publisher)
        log.info("publisher %x of %s/%s ready (%s)", publisher_id, scope, topic, type(transport).__name__)
        return publisher

    @property
    def next_sequence(self) -> int:
        return self._sequence

    async def publish(self, event: Any) -> int:
        """Publish ``event`` (bytes as they are, anything else as MessagePack); returns its sequence.

        Does not wait for the network: the transport batches writes.
        """
        if self._closed:
            raise ClosedError(f"publisher {self.publisher_id:x} of {self.topic!r} is closed")
        payload = (
            bytes(event) if isinstance(event, bytes | bytearray | memoryview) else _encode_payload(event)
        )
        if len(payload) > self._max_bytes:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes exceeds max_message_bytes={self._max_bytes} "
                "(MESHPLANE_MAX_MESSAGE_BYTES)"
            )
        sequence = self._sequence
        envelope = EventEnvelope(
            self.publisher_id, sequence, time.time_ns() // 1_000_000, self.topic, payload
        )
        await self._transport.send(envelope)
        self._sequence = sequence + 1
        return sequence

    async def send_heartbeat(self) -> None:
        """Tell subscribers this publisher is alive and which sequence comes next (the plane calls this)."""
        if not self._closed:
            now_ms = time.time_ns() // 1_000_000
            await self._transport.send_heartbeat(
                EventEnvelope(self.publisher_id, self._sequence, now_ms, self.topic, b"")
            )

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything published so far has been handed to the network."""
        await self._transport.flush(timeout)

    @property
    def subscriber_count(self) -> int | None:
        """Subscribers connected to this publisher, where the transport can tell (ZeroMQ); else None."""
        return self._transport.subscriber_count()

    async def wait_for_subscribers(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until ``count`` subscribers can receive, so that the first events are not lost.

        ZeroMQ counts the subscriptions that reached this publisher's socket (in broker mode one per
        broker and subscriber); NATS counts the subscribers registered in discovery, which register
        once the server has their subscription.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        while (found := await self._count_subscribers()) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{found} of {count} subscribers connected after {timeout}s")
            await asyncio.sleep(0.01)

    async def _count_subscribers(self) -> int:
        counted = self._transport.subscriber_count()
        if counted is not None:
            return counted
        discovery = await self.plane.discovery()
        return len(await discovery.list(self.scope.subscriber_prefix(self.topic)))

    async def close(self) -> None:
        """Unregister from discovery and release the transport (the plane too, if it is private)."""
        if self._closed:
            return
        self._closed = True
        self.plane._release(self)
        try:
            if self._discovery is not None and self.channel is not None:
                await self._discovery.unregister(self.channel.key)
        finally:
            try:
                await self._transport.flush(1.0)
            except MeshplaneError as exc:
                log.warning("publisher %x: final flush failed: %s", self.publisher_id, exc)
            await self._transport.close()
            if self._owns_plane:
                await self.plane.close()

    async def __aenter__(self) -> EventPublisher:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<EventPublisher {self.scope}/{self.topic} id={self.publisher_id:x}>"
