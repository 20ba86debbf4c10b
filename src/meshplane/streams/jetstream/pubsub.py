"""Pub/sub across the servers of one JetStream cluster, over core NATS (pub/sub keeps no history).

Each server publishes what its clients publish to ``meshplane.streams.ps.<topic>`` and hears every
other server's there (one subscription), then delivers to its own listeners by their patterns:
Synap's ``#`` wildcard is not NATS's, so the matching stays meshplane's. A server skips its own
messages, which it delivered when they were published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from nats.aio.client import Client
from nats.aio.msg import Msg

from meshplane.streams.pubsub import PubSub

log = logging.getLogger(__name__)

PREFIX = "meshplane.streams.ps."
ORIGIN_HEADER = "Meshplane-Origin"
QUEUE_MESSAGES = 10_000  # published here and not yet handed to NATS; more are dropped, counted


class ClusterPubSub:
    """The pub/sub service's hook (as a mesh node's): what is published here goes to the others."""

    guaranteed = False

    def __init__(self, nc: Client, pubsub: PubSub, prefix: str = PREFIX) -> None:
        self.nc = nc
        self.prefix = prefix  # its VPN's (jetstream/naming.py): servers share each VPN's messages only
        self.pubsub = pubsub
        self.origin = uuid.uuid4().hex
        self.dropped = 0
        self._outgoing: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(QUEUE_MESSAGES)
        self._sender: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.nc.subscribe(self.prefix + ">", cb=self._on_message)
        self._sender = asyncio.create_task(self._send())
        self.pubsub.mesh = self

    async def close(self) -> None:
        self.pubsub.mesh = None
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender

    def interest(self, pattern: str, added: bool) -> None:
        pass  # every server hears every message: the patterns are matched where the listeners are

    def published(self, topic: str, frame: bytes) -> None:
        try:
            self._outgoing.put_nowait((topic, frame))
        except asyncio.QueueFull:
            self.dropped += 1
            self.pubsub.dropped += 1

    async def published_guaranteed(self, topic: str, frame: bytes) -> None:
        raise AssertionError("not guaranteed: PubSub refuses before publishing")

    async def _send(self) -> None:
        headers = {ORIGIN_HEADER: self.origin}
        while True:
            topic, frame = await self._outgoing.get()
            try:
                await self.nc.publish(self.prefix + topic, frame, headers=headers)
            except Exception as exc:  # the connection is reconnecting or closed: pub/sub is best effort
                self.dropped += 1
                self.pubsub.dropped += 1
                log.debug("pub/sub message for %s not sent to the other servers: %r", topic, exc)

    async def _on_message(self, msg: Msg) -> None:
        if (msg.headers or {}).get(ORIGIN_HEADER) == self.origin:
            return
        self.pubsub.deliver(msg.subject[len(self.prefix) :], msg.data)
