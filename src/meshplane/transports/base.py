"""The transport interface: every transport package has the same two classes."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from meshplane.core.envelope import EventEnvelope
from meshplane.core.framing import Frame
from meshplane.core.records import EventChannel
from meshplane.errors import WireError

#: What a transport hands its subscriber: a Frame, the WireError of a message that could not be decoded,
#: or a bare envelope: an event under the subscriber's own routing topic (checked by the transport).
Received = EventEnvelope | Frame | WireError


class PublisherTransport(abc.ABC):
    """Sends one publisher's envelopes; never awaits the network per message."""

    #: A synchronous ``send``, where sending never waits (ZeroMQ): ``publish`` calls it and saves a
    #: coroutine per event. None: ``publish`` awaits ``send``.
    send_now: Callable[[EventEnvelope], None] | None = None
    #: Where the transport can build the envelope itself (ZeroMQ's compiled sender):
    #: ``send_payload(sequence, payload)`` sends the publisher's event with the current time and returns
    #: 0, or returns an errno having sent nothing, and ``publish`` then takes the envelope path.
    send_payload: Callable[[int, bytes], int] | None = None
    #: The same for a list: ``send_payloads(first_sequence, payloads, start)`` sends ``payloads[start:]``
    #: (``payloads[i]`` as sequence ``first_sequence + i``) until one is refused with nothing of it sent,
    #: and returns ``(sent, errno)``; ``publish_many`` sends the refused one by the envelope path.
    send_payloads: Callable[[int, list[bytes], int], tuple[int, int]] | None = None
    #: Events sent while no subscriber could receive them, where the transport can tell (ZeroMQ drops
    #: them in the socket: the slow joiner, or in broker mode the hop to the brokers).
    unrouted = 0

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    def discovery_transport(self) -> tuple[str, dict[str, Any]] | None:
        """``(kind, config)`` for the publisher's discovery record; None: the publisher is not registered."""

    @abc.abstractmethod
    async def send(self, envelope: EventEnvelope) -> None: ...

    async def send_many(self, envelopes: list[EventEnvelope]) -> None:
        """Send ``envelopes`` in order (transports with a cheaper loop than ``send`` override this)."""
        for envelope in envelopes:
            await self.send(envelope)

    @abc.abstractmethod
    async def send_heartbeat(self, envelope: EventEnvelope) -> None:
        """A heartbeat: ``envelope.sequence`` is the sequence the next event will carry."""

    @abc.abstractmethod
    async def flush(self, timeout: float) -> None:
        """Hand everything sent so far to the network (or the socket's queue)."""

    def subscriber_count(self) -> int | None:
        """Subscribers currently interested, where the transport can tell (None where it cannot)."""
        return None

    @abc.abstractmethod
    async def close(self) -> None: ...


class SubscriberTransport(abc.ABC):
    """Receives one topic's messages, in batches: one await per batch, not per message."""

    #: How the transport depends on publishers' discovery records: "required" (it connects to each
    #: publisher), "optional" (it receives without them; they only tell who publishes) or "none".
    publisher_discovery = "optional"
    #: Whether the subscriber announces itself in discovery (where publishers cannot see subscriptions).
    announces = False
    #: Copies of an event dropped before delivery (multi-broker deduplication).
    duplicates_dropped = 0
    #: ``(publisher_id, first_sequence)`` when the batch ``receive`` last returned is, whole, that
    #: publisher's consecutive events of the subscriber's topic (transports that can tell without
    #: looking at each event say so, and the intake takes the batch at once); None otherwise.
    batch_run: tuple[int, int] | None = None

    @abc.abstractmethod
    async def start(self) -> None: ...

    def add_publisher(self, channel: EventChannel) -> None:
        """A publisher was discovered (transports that connect per publisher act on it)."""

    def remove_publisher(self, channel: EventChannel) -> None:
        """A publisher left discovery."""

    def publisher_left(self, publisher_id: int) -> None:
        """A publisher said goodbye: nothing more comes from it (a connection per publisher can close)."""

    @property
    def drops(self) -> dict[str, int]:
        """Messages dropped before the subscriber saw them, by reason (``queue_full``: its own bounded
        queue; ``slow_consumer``: the client library's)."""
        return {}

    def reconnect_publisher(self, publisher_id: int) -> None:
        """A publisher went silent: connect to it afresh (transports with a connection per publisher)."""

    def unread(self) -> bool:
        """Whether messages wait that the subscriber has not taken: while they do, a publisher's silence
        may be the application's being behind (its events and heartbeats are among them)."""
        return False

    @property
    def paths(self) -> int:
        """Routes an event can take to this subscriber: above 1, events may arrive out of order."""
        return 1

    @abc.abstractmethod
    async def receive(self) -> list[Received]:
        """Wait for at least one message, then return everything already waiting (bounded)."""

    @abc.abstractmethod
    async def close(self) -> None: ...
