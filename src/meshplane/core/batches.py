"""Batch messages: a list of events in one ZeroMQ message, between meshplane peers only.

A ZeroMQ message costs libzmq ~0.3 us on each side whatever its size, more than meshplane spends on a
100-byte event, so a direct-mode publisher sends a list (``publish_many``) as batch messages when every
subscription it has seen is a meshplane subscriber's: frames ``[BATCH_MARK + routing topic, items]``,
the items being events in the 8-byte-header layout (header and body) back to back, up to
``BATCH_BYTES`` a message. Subscribers with the compiled receive subscribe to both topics; anything
else (the Dynamo runtime, a raw SUB, a subscriber without the extension) subscribes to the routing topic
alone, and while one is connected the publisher sends each event as its own message. The mark is a byte
no routing topic starts with, so a subscription to a routing topic never matches a batch.

Nothing here does I/O: the batch decoder, and the tally of an XPUB socket's subscriptions that decides.
"""

from __future__ import annotations

from meshplane.core.envelope import EventEnvelope
from meshplane.core.framing import HEADER8_SIZE, Frame, decode_header8_event
from meshplane.errors import MalformedFrame, TruncatedFrame, WireError

BATCH_MARK = b"\x00"
#: A batch message's items, at most (an event larger than this goes in a batch of its own).
BATCH_BYTES = 16 * 1024
#: Lists shorter than this go event by event: a batch saves nothing on a few events.
BATCH_AT_LEAST = 16


def batch_topic(routing_topic: bytes) -> bytes:
    return BATCH_MARK + routing_topic


def decode_batch(
    items: bytes, routing_topic: bytes, max_bytes: int
) -> list[EventEnvelope | Frame | WireError]:
    """A batch message's items, each decoded as the 8-byte-header message it is (a bad one as its error;
    an item whose length runs past the message ends the batch with that error)."""
    if not items:
        return [MalformedFrame("empty batch message")]
    out: list[EventEnvelope | Frame | WireError] = []
    offset, size = 0, len(items)
    while offset < size:
        if size - offset < HEADER8_SIZE:
            out.append(TruncatedFrame(f"batch item needs {HEADER8_SIZE} header bytes, {size - offset} left"))
            break
        end = offset + HEADER8_SIZE + int.from_bytes(items[offset + 4 : offset + 8], "big")
        if end > size:
            out.append(TruncatedFrame(f"batch item announces {end - offset} bytes, {size - offset} left"))
            break
        try:
            out.append(decode_header8_event(items[offset:end], routing_topic, max_bytes))
        except WireError as exc:
            out.append(exc)
        offset = end
    return out


class SubscriptionTally:
    """The subscriptions an XPUB socket reported (with XPUB_VERBOSER, every subscribe and unsubscribe),
    counted as the routing topic's, the batch topic's, and any other (a prefix, another topic)."""

    def __init__(self, routing_topic: bytes) -> None:
        self._routing_topic = routing_topic
        self._batch_topic = batch_topic(routing_topic)
        self.plain = 0
        self.batches = 0
        self.other = 0

    def add(self, message: bytes) -> None:
        """One subscription message: ``\\x01`` or ``\\x00`` (unsubscribe), then the topic."""
        kind, topic = message[:1], message[1:]
        if kind not in (b"\x00", b"\x01"):
            return  # not a subscription message (XPUB delivers nothing else; ignore rather than guess)
        delta = 1 if kind == b"\x01" else -1
        if topic == self._routing_topic:
            self.plain += delta
        elif topic == self._batch_topic:
            self.batches += delta
        else:
            self.other += delta

    @property
    def batches_welcome(self) -> bool:
        """Every subscriber takes batches: each one subscribed to both topics, and no one to anything else."""
        return self.batches > 0 and self.batches == self.plain and self.other == 0
