"""What a subscriber transport received and its subscriber has not taken yet (NATS, memory)."""

from __future__ import annotations

import asyncio
from typing import Any

from meshplane.core.envelope import msgpack_envelope_decoder
from meshplane.core.framing import decode_nats_event
from meshplane.errors import WireError
from meshplane.transports.base import Received
from meshplane.transports.native import ExpectedEnvelope, NativeNatsDecode, Run

_decode_map = msgpack_envelope_decoder.decode
MAX_BATCH = 4096  # messages decoded per receive(): large enough to amortise, small enough to stay fair


class Inbox:
    """Bounded: when the application does not keep up, new messages are dropped and counted (and
    show up as gaps)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending: list[bytes] = []
        self._ready = asyncio.Event()
        self.dropped = 0

    def put(self, data: bytes) -> None:
        if len(self._pending) >= self._limit:
            self.dropped += 1
            return
        self._pending.append(data)
        self._ready.set()

    def put_many(self, batch: list[bytes]) -> None:
        room = self._limit - len(self._pending)
        if len(batch) > room:
            self.dropped += len(batch) - max(room, 0)
            batch = batch[: max(room, 0)]
        if batch:
            self._pending.extend(batch)
            self._ready.set()

    def __len__(self) -> int:
        return len(self._pending)

    def wake(self) -> None:
        """Let a waiting :meth:`take` return (at close)."""
        self._ready.set()

    async def take(self) -> list[bytes]:
        """The next batch, in arrival order; empty when woken with nothing pending."""
        await self._ready.wait()
        batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        if not self._pending:
            self._ready.clear()
        return batch


def decode_messages(
    batch: list[bytes],
    routing_topic: bytes,
    max_bytes: int,
    native: NativeNatsDecode | None = None,
    expected: ExpectedEnvelope | None = None,
) -> tuple[list[Received], Run]:
    """NATS-encoded messages of the subscriber's own subject (events bare, heartbeats as Frames), or
    the error that says what was wrong with each; ``native``, the compiled decoder, takes the common
    events and hands the others back as they came, and says when they are a run of ``expected``'s."""
    if native is None:
        return [_decode(data, routing_topic, max_bytes) for data in batch], None
    decoded: list[Any] = []
    unusual, run = native(batch, max_bytes, _decode_map, decoded, expected)
    if unusual:
        for index, item in enumerate(decoded):
            if type(item) is bytes:
                decoded[index] = _decode(item, routing_topic, max_bytes)
    return decoded, run


def _decode(data: bytes, routing_topic: bytes, max_bytes: int) -> Received:
    try:
        return decode_nats_event(data, routing_topic, max_bytes)
    except WireError as exc:
        return exc
