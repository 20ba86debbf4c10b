"""Fire-and-forget pub/sub with wildcard subscriptions (no history, as in Synap), bounded everywhere.

Patterns live in one :class:`~meshplane.core.subjects.PatternIndex` (matching is linear). Live
listeners (WebSocket) get each message as a JSON frame built once, through a queue bounded in count
and bytes; a listener that falls behind loses messages, counted. Subscriptions registered over
HTTP (Synap's ``pubsub.subscribe``) count towards ``subscribers_matched`` and expire unless renewed.

On a mesh node, a :class:`MeshHook` hears when a pattern gets its first holder here or loses its
last (the node's aggregated interest) and of every message published here; messages from other
nodes come in through :meth:`PubSub.deliver`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from meshplane.core.backpressure import BackpressurePolicy, SubscriberQueue
from meshplane.core.subjects import RESERVED, InvalidSubject, PatternIndex, validate
from meshplane.streams.errors import BadRequest, LimitReached

_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class PubSubLimits:
    queue_messages: int = 10_000  # per live listener
    queue_bytes: int = 16 * 1024 * 1024  # per live listener
    patterns_per_subscriber: int = 1_000
    registered_subscribers: int = 100_000
    registration_ttl_secs: float = 3600.0  # a registration not renewed for this long is dropped
    listeners: int = 10_000
    topics_remembered: int = 10_000  # for pubsub.topics: the most recently published
    backpressure_policy: BackpressurePolicy = "drop_newest"


class MeshHook(Protocol):
    @property
    def guaranteed(self) -> bool:
        """Whether it can store messages for guaranteed delivery."""
        ...

    def interest(self, pattern: str, added: bool) -> None: ...

    async def published_guaranteed(self, topic: str, frame: bytes) -> None: ...

    def published(self, topic: str, frame: bytes) -> None: ...


def _unreserved(name: str) -> str:
    """``name`` unless its first token is the mesh's (``$vpn:team-b.``: another VPN's subjects, ``$G.``:
    queues' interest), which are matched by name: a pattern there heard that VPN's messages."""
    if name.startswith(RESERVED):
        raise BadRequest(f"{name[:80]!r}: a first token starting with {RESERVED!r} is reserved to the mesh")
    return name


def check_subject(subject: object) -> str:
    try:
        return _unreserved(validate(subject, wildcards=False))
    except InvalidSubject as exc:
        raise BadRequest(str(exc)) from None


def check_patterns(patterns: list[str], limit: int) -> list[str]:
    if len(patterns) > limit:
        raise BadRequest(f"{len(patterns)} patterns; at most {limit} per subscriber")
    try:
        return [_unreserved(validate(p, wildcards=True)) for p in patterns]
    except InvalidSubject as exc:
        raise BadRequest(str(exc)) from None


class PubSubListener:
    """A live subscriber: frames wait in a queue bounded in count and bytes, and the limits' policy
    says what a full queue does (``disconnect``: :meth:`next_frame` raises ConnectionError)."""

    def __init__(self, listener_id: str, patterns: list[str], limits: PubSubLimits) -> None:
        self.listener_id = listener_id
        self.patterns = patterns
        self.queue: SubscriberQueue[bytes] = SubscriberQueue(
            limits.queue_messages, limits.queue_bytes, limits.backpressure_policy
        )
        self._ready = asyncio.Event()

    @property
    def dropped(self) -> int:
        return self.queue.dropped

    def offer(self, frame: bytes) -> bool:
        queued = self.queue.offer(frame, len(frame))
        self._ready.set()
        return queued

    async def next_frame(self) -> bytes:
        while not self.queue:
            if self.queue.overflowed:
                raise ConnectionError(f"pub/sub listener {self.listener_id} fell too far behind")
            self._ready.clear()
            await self._ready.wait()
        return self.queue.take()


class PubSub:
    def __init__(self, limits: PubSubLimits | None = None) -> None:
        self.limits = limits or PubSubLimits()
        self._trie: PatternIndex[str] = PatternIndex()  # values: "r:<subscriber>" or "l:<listener>"
        self.registered: OrderedDict[str, tuple[float, set[str]]] = OrderedDict()  # oldest renewal first
        self.listeners: dict[str, PubSubListener] = {}
        self._holders: dict[str, int] = {}  # pattern -> registrations and listeners holding it
        self.mesh: MeshHook | None = None
        self.topics: OrderedDict[str, int] = OrderedDict()  # topic -> messages, most recent last
        self.published = 0
        self.delivered = 0
        self.dropped = 0
        self.expired = 0

    # --- HTTP-registered subscriptions ---------------------------------------------------------------

    def register(self, subscriber: str, patterns: list[str], now: float | None = None) -> set[str]:
        """Add patterns to a subscriber (renewing it); returns all its patterns."""
        now = time.monotonic() if now is None else now
        self.expire(now)
        check_patterns(patterns, self.limits.patterns_per_subscriber)
        _, held = self.registered.pop(subscriber, (now, set()))
        if not held and len(self.registered) >= self.limits.registered_subscribers:
            raise LimitReached(
                f"{self.limits.registered_subscribers} registered subscribers (the limit)",
                "pubsub_registrations",
            )
        if len(held | set(patterns)) > self.limits.patterns_per_subscriber:
            self.registered[subscriber] = (now, held)
            raise BadRequest(f"at most {self.limits.patterns_per_subscriber} patterns per subscriber")
        for pattern in patterns:
            if pattern not in held:
                self._insert(pattern, "r:" + subscriber)
                held.add(pattern)
        self.registered[subscriber] = (now, held)
        return held

    def unregister(self, subscriber: str, patterns: list[str] | None) -> list[str]:
        """Remove patterns (all when None) from a subscriber; returns those removed."""
        _, held = self.registered.get(subscriber, (0.0, set()))
        removed = [p for p in (sorted(held) if patterns is None else patterns) if p in held]
        for pattern in removed:
            held.discard(pattern)
            self._remove(pattern, "r:" + subscriber)
        if not held:
            self.registered.pop(subscriber, None)
        return removed

    def expire(self, now: float) -> None:
        cutoff = now - self.limits.registration_ttl_secs
        while self.registered:
            subscriber, (renewed, _) = next(iter(self.registered.items()))
            if renewed >= cutoff:
                break
            self.unregister(subscriber, None)
            self.expired += 1

    # --- live listeners ------------------------------------------------------------------------------

    def listen(self, listener_id: str, patterns: list[str]) -> PubSubListener:
        check_patterns(patterns, self.limits.patterns_per_subscriber)
        if listener_id in self.listeners:
            raise BadRequest(f"listener {listener_id!r} is already connected")
        if len(self.listeners) >= self.limits.listeners:
            raise LimitReached(
                f"{self.limits.listeners} live pub/sub listeners (the limit)", "pubsub_listeners"
            )
        listener = PubSubListener(listener_id, patterns, self.limits)
        self.listeners[listener_id] = listener
        for pattern in set(patterns):
            self._insert(pattern, "l:" + listener_id)
        return listener

    def forget(self, listener_id: str) -> None:
        listener = self.listeners.pop(listener_id, None)
        if listener is not None:
            for pattern in set(listener.patterns):
                self._remove(pattern, "l:" + listener_id)

    def _insert(self, pattern: str, value: str) -> None:
        if not self._trie.insert(pattern, value):
            return
        count = self._holders.get(pattern, 0)
        self._holders[pattern] = count + 1
        if count == 0 and self.mesh is not None:
            self.mesh.interest(pattern, True)

    def _remove(self, pattern: str, value: str) -> None:
        if not self._trie.remove(pattern, value):
            return
        count = self._holders.pop(pattern) - 1
        if count:
            self._holders[pattern] = count
        elif self.mesh is not None:
            self.mesh.interest(pattern, False)

    @property
    def patterns(self) -> set[str]:
        """Every pattern someone holds here (what a mesh node announces for this service)."""
        return set(self._holders)

    # --- publishing ----------------------------------------------------------------------------------

    def publish(self, topic: str, payload: Any, metadata: dict[str, str] | None) -> dict[str, Any]:
        result, frame = self._publish(topic, payload, metadata)
        if self.mesh is not None:
            self.mesh.published(topic, frame)
        return result

    async def publish_guaranteed(
        self, topic: str, payload: Any, metadata: dict[str, str] | None
    ) -> dict[str, Any]:
        """Publish, and return once the mesh has stored the message for every queue that wants it."""
        if self.mesh is None or not self.mesh.guaranteed:
            raise BadRequest("guaranteed delivery needs a mesh node: start the server with --node-id")
        result, frame = self._publish(topic, payload, metadata)
        await self.mesh.published_guaranteed(topic, frame)
        return result | {"guaranteed": True}

    def _publish(
        self, topic: str, payload: Any, metadata: dict[str, str] | None
    ) -> tuple[dict[str, Any], bytes]:
        """To the listeners here: the answer, and the frame they got."""
        check_subject(topic)
        message = {
            "type": "message",
            "message_id": uuid.uuid4().hex,
            "topic": topic,
            "payload": payload,
            "metadata": metadata or {},
            "timestamp": time.time(),
        }
        self.published += 1
        self.topics[topic] = self.topics.pop(topic, 0) + 1
        while len(self.topics) > self.limits.topics_remembered:
            self.topics.popitem(last=False)
        frame = _json.encode(message)
        matched = self._deliver(topic, frame)
        return {"message_id": message["message_id"], "topic": topic, "subscribers_matched": matched}, frame

    def deliver(self, topic: str, frame: bytes) -> int:
        """A message published elsewhere (a mesh peer): to the live listeners here, not further."""
        return self._deliver(topic, frame)

    def _deliver(self, topic: str, frame: bytes) -> int:
        matched = self._trie.match(topic)
        for value in matched:
            if not value.startswith("l:"):
                continue
            listener = self.listeners.get(value[2:])
            if listener is None:
                continue
            dropped_before = listener.dropped
            if listener.offer(frame):
                self.delivered += 1
            self.dropped += listener.dropped - dropped_before  # drop_oldest drops older frames
        return len(matched)
