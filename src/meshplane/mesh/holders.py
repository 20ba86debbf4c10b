"""Who holds interest on a node, and how an event reaches them: a mesh client's connection, or the
node's pub/sub service (its WebSocket listeners and HTTP registrations)."""

from __future__ import annotations

import base64
import logging
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from meshplane.core.backpressure import SubscriberQueue
from meshplane.core.mesh.frames import FLAG_JSON_MESSAGE, encode_event
from meshplane.core.mesh.permissions import Permissions
from meshplane.core.mesh.vpn import DEFAULT
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.preauth import QuietLog
from meshplane.streams.pubsub import PubSub

log = logging.getLogger(__name__)

_json = msgspec.json.Encoder()


@dataclass(slots=True)
class MeshEvent:
    """An event as a node handles it; ``raw`` is its EVENT frame as its origin made it."""

    source: str
    subject: str
    sequence: int
    timestamp_ms: int
    body: bytes
    flags: int = 0
    _raw: bytes | None = None
    imported: bool = False  # renamed from an exporter's VPN: no queue of the importer stored it

    @property
    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = encode_event(
                self.source, self.subject, self.sequence, self.timestamp_ms, self.body, self.flags
            )
        return self._raw

    @property
    def event_id(self) -> str:
        return f"{self.timestamp_ms}-{self.sequence}-{self.source}"


class Holder(Hashable, Protocol):
    def deliver(self, event: MeshEvent) -> None: ...


def delivery_failed(counters: Counter[str], quiet: QuietLog, holder: Holder, exc: Exception) -> None:
    """A holder's delivery raised (a bug, not a slow socket): that event is lost to it alone (a line a
    second at most: a holder may fail at every event)."""
    counters["delivery_failures"] += 1
    quiet.error("delivery_failed", "delivering to %r failed, event dropped for it: %r", holder, exc)


class Routing(Protocol):
    """What a node offers its holders (MeshNode)."""

    def subscribe(self, holder: Holder, pattern: str) -> None: ...

    def unsubscribe(self, holder: Holder, pattern: str) -> None: ...

    def publish(self, subject: str, body: bytes, flags: int = 0, *, skip: Holder | None = None) -> int: ...

    async def publish_guaranteed(
        self, subject: str, body: bytes, flags: int = 0, *, skip: Holder | None = None
    ) -> None: ...


#: What a queued frame costs beyond its bytes (the bytes object's header, the deque's slot): charged
#: to the queue's byte bound, so that bound is the memory a client can make the node hold.
QUEUED_FRAME_OVERHEAD = 48


@dataclass(eq=False)
class ClientSession:
    """A mesh client (the event plane's ``mesh`` transport) connected to this node.

    Frames go straight to the socket; while the socket pushes back they wait in a queue bounded by
    the node's backpressure settings, whose policy decides what a full queue drops (or, with
    ``disconnect``, that the client is closed)."""

    client_id: str
    conn: FrameConnection
    queue: SubscriberQueue[bytes]
    origin: str = ""  # the source id its EVENTs carry
    vpn: str = DEFAULT  # its Message VPN ...
    prefix: str = ""  # ... whose prefix its subjects and patterns carry (it puts it on, and takes it off)
    user: str = ""  # the VPN user it logged in as ...
    permissions: Permissions | None = None  # ... and what that user may do (None: anything)
    login_pending: bool = False  # its VPN has users and it has not logged in yet
    batched_acks: bool = False  # it takes one ACK for many stored events (its HELLO said so)
    stored: list[int] = field(default_factory=list)  # its events stored since its last batched ACK
    answer: Callable[[int, str], None] = field(default=lambda sequence, error: None)  # (EVENT number, error)
    delivered: int = 0  # handed to the socket
    on_overflow: Callable[[ClientSession], None] = field(default=lambda session: None)

    def deliver(self, event: MeshEvent) -> None:
        raw = event.raw  # a VPN's client takes its VPN's prefix off itself
        if not self.conn.paused and not self.queue:
            self.conn.send(raw)
            self.delivered += 1
            return
        self.queue.offer(raw, len(raw) + QUEUED_FRAME_OVERHEAD)
        if self.queue.overflowed:
            self.on_overflow(self)

    def resume(self) -> None:
        """The socket drained: send what waited, until it pushes back again."""
        while self.queue and not self.conn.paused:
            self.conn.send(self.queue.take())
            self.delivered += 1

    @property
    def dropped(self) -> int:
        return self.queue.dropped


@dataclass(eq=False)
class PubSubHolder:
    """The node's pub/sub service as one holder: it aggregates its own listeners already."""

    pubsub: PubSub
    delivered: int = 0

    def deliver(self, event: MeshEvent) -> None:
        # A pub/sub message comes as the origin's listener frame, to pass on as it is.
        json_message = event.flags & FLAG_JSON_MESSAGE
        frame = event.body if json_message else _json.encode(as_pubsub_message(event))
        self.delivered += self.pubsub.deliver(event.subject, frame)


def as_pubsub_message(event: MeshEvent) -> dict[str, object]:
    """An opaque event (an event-plane envelope) as pub/sub listeners receive messages: JSON bodies
    as JSON, anything else in base64 (``metadata.encoding`` says which)."""
    try:
        payload: object = msgspec.json.decode(event.body)
        encoding = "json"
    except msgspec.DecodeError:
        payload = base64.b64encode(event.body).decode()
        encoding = "base64"
    return {
        "type": "message",
        "message_id": event.event_id,
        "topic": event.subject,
        "payload": payload,
        "metadata": {"encoding": encoding, "origin": event.source},
        "timestamp": event.timestamp_ms / 1000,
    }


@dataclass(eq=False)
class PubSubBridge:
    """The pub/sub service's hook: its interest becomes the node's, its messages the node's events."""

    node: Routing
    holder: PubSubHolder
    guaranteed = True

    def interest(self, pattern: str, added: bool) -> None:
        if added:
            self.node.subscribe(self.holder, pattern)
        else:
            self.node.unsubscribe(self.holder, pattern)

    def published(self, topic: str, frame: bytes) -> None:
        self.node.publish(topic, frame, FLAG_JSON_MESSAGE, skip=self.holder)

    async def published_guaranteed(self, topic: str, frame: bytes) -> None:
        await self.node.publish_guaranteed(topic, frame, FLAG_JSON_MESSAGE, skip=self.holder)
