"""What a NATS flush promises, against a real nats-server: nothing published afterwards is missed.

nats-py 2.16 writes a flush's PING straight to the socket, ahead of the commands still queued for its
flusher task, so the PONG can come back before an earlier SUB or PUB reached the server (about one
flush in a hundred on this machine). Each test repeats its step often enough to meet that race.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from meshplane import EventEnvelope, EventPlane, Scope, WireFormat
from meshplane.core.framing import encode_nats
from meshplane.launchers import NatsServer
from meshplane.transports.nats import NatsSubscriberTransport, connect_nats, flush_in_order
from tests.conftest import make_config

ROUNDS = 1000


@pytest.fixture
async def peer(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A plain nats-py client: the other side."""
    client = await nats.connect(nats_server.url)
    yield client
    await client.close()


@pytest.mark.timeout(120)
async def test_a_subscriber_misses_nothing_published_once_it_started(
    nats_server: NatsServer, peer: Client
) -> None:
    client = await connect_nats(nats_server.url, 10)
    try:
        for round_ in range(ROUNDS):
            subject = f"flush.{uuid.uuid4().hex}.kv"
            transport = NatsSubscriberTransport(client, subject, 1 << 20, 1000)
            await transport.start()
            envelope = EventEnvelope(7, round_, int(time.time() * 1000), "kv", b"x")
            await peer.publish(subject, encode_nats(envelope, WireFormat.DYNAMO))
            received = await asyncio.wait_for(transport.receive(), 5)
            assert received == [envelope], round_
            await transport.close()
    finally:
        await client.close()


@pytest.mark.timeout(120)
async def test_a_publisher_flush_returns_once_the_server_routed_every_event(
    nats_server: NatsServer, peer: Client, tmp_path: Path
) -> None:
    async with EventPlane(make_config("nats", "file", tmp_path, nats_server, None)) as plane:
        for round_ in range(ROUNDS):
            scope = Scope.endpoint(f"flush{uuid.uuid4().hex[:8]}", "worker", "generate")
            raw = await peer.subscribe(scope.subject("kv"))
            await flush_in_order(peer, 5)
            pub = await plane.publisher(scope, "kv")
            await pub.publish_many(range(3))
            await pub.flush()
            # the server wrote them to the peer before the peer's PONG: they are in its queue now
            await flush_in_order(peer, 5)
            assert raw.pending_msgs == 3, round_
            await raw.unsubscribe()
            await pub.close()
