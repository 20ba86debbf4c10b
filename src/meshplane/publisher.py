"""``EventPublisher``: publish events on one topic of one scope; registered in discovery while open."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from time import time_ns
from typing import TYPE_CHECKING, Any

import msgspec

from meshplane.core.envelope import EventEnvelope
from meshplane.core.heads import encode_news
from meshplane.core.names import Scope
from meshplane.core.records import EventChannel
from meshplane.discovery import Discovery
from meshplane.errors import ClosedError, MeshplaneError, PayloadTooLarge
from meshplane.membership import Membership, PlaneMember
from meshplane.transports.base import PublisherTransport

if TYPE_CHECKING:
    from meshplane.plane import EventPlane

log = logging.getLogger(__name__)
_encode_payload = msgspec.msgpack.Encoder().encode


class EventPublisher(PlaneMember):
    """Publishes events on ``topic`` in ``scope``.

    ``await EventPublisher.create(scope, topic)`` binds or connects the transport and registers the
    publisher in discovery; ``close()`` (or leaving ``async with``) says goodbye to its subscribers (a
    final heartbeat with its next sequence) and unregisters it. ``name`` is its instance name and
    ``identity`` the stable number made of it, the scope and the topic (broker mode picks brokers by it);
    ``publisher_id`` is new each life.
    """

    def __init__(
        self,
        scope: Scope,
        topic: str,
        publisher_id: int,
        transport: PublisherTransport,
        membership: Membership,
        name: str = "",
        identity: int | None = None,
    ) -> None:
        super().__init__(membership)
        self.scope = scope
        self.topic = topic
        self.publisher_id = publisher_id
        self.name = name
        self.identity = publisher_id if identity is None else identity
        self._born = time.monotonic()  # heartbeats tell the age: subscribers judge what they missed by it
        self._transport = transport
        self._max_bytes = membership.config.max_message_bytes
        self._sequence = 0  # the next sequence to take
        self._closed = False
        # True once closed, or while a send waits (for room, for the network): publishes then wait their
        # turn, so that sequences are taken and handed over in order
        self._held = False
        self._turns: deque[asyncio.Future[None]] = deque()
        # While a send waits: the first sequence taken and not yet handed to the transport. Heartbeats
        # announce no further: a subscriber told of an event before it comes reports it missing.
        self._unsent: int | None = None
        self._registered_in: Discovery | None = None
        registration = transport.discovery_transport()
        #: The discovery record; None where the transport registers no publishers (broker mode).
        self.channel = EventChannel(scope, topic, publisher_id, *registration) if registration else None

    @classmethod
    def _made_by(cls, plane: EventPlane) -> Callable[..., Awaitable[EventPublisher]]:
        return plane.publisher

    async def _start(self) -> None:
        """Put this publisher's record in discovery (the plane calls this once, after opening it)."""
        if self.channel is not None:
            discovery = await self._membership.discovery()
            await discovery.register(self.channel.key, self.channel.to_json())
            self._registered_in = discovery
        log.info(
            "publisher %x of %s/%s ready (%s)",
            self.publisher_id,
            self.scope,
            self.topic,
            type(self._transport).__name__,
        )

    @property
    def next_sequence(self) -> int:
        return self._sequence

    async def publish(self, event: Any) -> int:
        """Publish ``event`` (bytes as they are, anything else as MessagePack); returns its sequence.

        Does not wait for the network: the transport batches writes. A publish that must wait (for room
        under MESHPLANE_SEND_WHEN_FULL=wait, for the network) and is cancelled or fails meanwhile has
        spent its sequence: subscribers may report it missing, never see a sequence used twice.
        """
        if self._held:
            await self._wait_turn()
        # bytes within the limit, the common case, without a call; anything else is checked there
        payload = event if type(event) is bytes and len(event) <= self._max_bytes else self._payload(event)
        sequence = self._sequence
        send_payload = self._transport.send_payload
        if send_payload is None or send_payload(sequence, payload):
            envelope = EventEnvelope(self.publisher_id, sequence, time_ns() // 1_000_000, self.topic, payload)
            send_now = self._transport.send_now
            if send_now is None:
                self._sequence = sequence + 1
                self._held, self._unsent = True, sequence
                try:
                    await self._transport.send(envelope)
                finally:  # _next_turn(), inline: NATS publishes all come this way
                    self._unsent = None
                    self._held = self._closed
                    if self._turns:
                        self._pass_turn()
                return sequence
            send_now(envelope)
        self._sequence = sequence + 1
        return sequence

    async def publish_many(self, events: Iterable[Any]) -> range:
        """Publish ``events`` in order, as ``publish`` does one by one, with one await for them all;
        returns their sequences.

        Every payload is checked before any is sent: one too large sends none. Their sequences are
        spent before sending, so should the transport fail part-way, subscribers see a gap, never a
        sequence used twice.
        """
        if self._held:
            await self._wait_turn()
        limit, payload_of = self._max_bytes, self._payload  # bytes within the limit: no call (as publish)
        payloads = [e if type(e) is bytes and len(e) <= limit else payload_of(e) for e in events]
        first = self._sequence
        self._sequence = first + len(payloads)
        sequences = range(first, self._sequence)
        transport = self._transport
        index = 0
        if transport.send_payloads is not None:
            sent, refused = transport.send_payloads(first, payloads, 0)
            if not refused:
                return sequences
            index = sent
        self._held, self._unsent = True, first + index
        try:
            if transport.send_payloads is None:
                now_ms = time_ns() // 1_000_000
                await transport.send_many(
                    [
                        EventEnvelope(self.publisher_id, s, now_ms, self.topic, p)
                        for s, p in zip(sequences, payloads, strict=True)
                    ]
                )
                return sequences
            while index < len(payloads):
                # refused (a full queue under XPUB_NODROP): the envelope path waits for room, or raises
                now_ms = time_ns() // 1_000_000
                await transport.send(
                    EventEnvelope(self.publisher_id, first + index, now_ms, self.topic, payloads[index])
                )
                index += 1
                # read again after each await: the transport may be closed (the sender is then None)
                send_payloads = transport.send_payloads
                if send_payloads is not None:
                    sent, refused = send_payloads(first, payloads, index)
                    index += sent
                    if not refused:
                        break
                self._unsent = first + index
        finally:
            self._next_turn()
        return sequences

    async def _wait_turn(self) -> None:
        """Wait until no send waits (raising once closed): publishes take their sequences in turn."""
        woken = False
        while self._held:
            self._check_open()
            turn = asyncio.get_running_loop().create_future()
            if woken:  # another send began to wait first: stay at the head of the line
                self._turns.appendleft(turn)
            else:
                self._turns.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._pass_turn()  # woken, then cancelled: the turn goes to the next one
                raise
            woken = True
        # The next in line follows once this publish has sent (without a yield from here) or begun to wait.
        self._pass_turn()

    def _next_turn(self) -> None:
        """The waiting send is over: let the next publish in."""
        self._unsent = None
        self._held = self._closed
        self._pass_turn()

    def _pass_turn(self) -> None:
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"publisher {self.publisher_id:x} of {self.topic!r} is closed")

    def _payload(self, event: Any) -> bytes:
        if type(event) is bytes:
            payload = event  # immutable: no copy needed
        elif isinstance(event, bytearray | memoryview):
            payload = bytes(event)
        else:
            payload = _encode_payload(event)
        if len(payload) > self._max_bytes:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes exceeds max_message_bytes={self._max_bytes} "
                "(MESHPLANE_MAX_MESSAGE_BYTES)"
            )
        return payload

    async def send_heartbeat(self) -> None:
        """Tell subscribers this publisher is alive and which sequence comes next (the plane calls this)."""
        if not self._closed:
            await self._heartbeat(final=False)

    async def _heartbeat(self, final: bool) -> None:
        now_ms = time_ns() // 1_000_000
        next_sequence = self._sequence if self._unsent is None else self._unsent
        news = encode_news(int((time.monotonic() - self._born) * 1000), final)
        await self._transport.send_heartbeat(
            EventEnvelope(self.publisher_id, next_sequence, now_ms, self.topic, news)
        )

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything published so far has been handed to the network."""
        await self._transport.flush(timeout)

    @property
    def unrouted(self) -> int:
        """Events sent while no subscriber could receive them, where the transport can tell: ZeroMQ
        drops them in this publisher's socket (in broker mode: the hop to the brokers)."""
        return self._transport.unrouted

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
        discovery = await self._membership.discovery()
        return len(await discovery.list(self.scope.subscriber_prefix(self.topic)))

    async def close(self) -> None:
        """Unregister from discovery and release the transport (the plane too, if it is private)."""
        if self._closed:
            return
        self._closed = self._held = True
        while self._turns:  # publishes waiting their turn raise ClosedError
            if not (turn := self._turns.popleft()).done():
                turn.set_result(None)
        self._leave_plane()
        try:
            # Goodbye, behind every event: subscribers report what of the tail did not reach them, and
            # a leave instead of a timeout (broker mode registers no record whose removal would say so).
            await self._heartbeat(final=True)
        except Exception as exc:  # a broken transport: subscribers will time out instead
            log.warning("publisher %x: goodbye failed: %s", self.publisher_id, exc)
        try:
            if self._registered_in is not None and self.channel is not None:
                await self._registered_in.unregister(self.channel.key)
        finally:
            try:
                await self._transport.flush(1.0)
            except MeshplaneError as exc:
                log.warning("publisher %x: final flush failed: %s", self.publisher_id, exc)
            await self._transport.close()
            await self._close_private_plane()

    def __repr__(self) -> str:
        return f"<EventPublisher {self.scope}/{self.topic} id={self.publisher_id:x}>"
