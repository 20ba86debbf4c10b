"""A node's heartbeats to its clients go out a burst at a time, spread over the interval: thousands of
clients' heartbeats (and their answers) at once held every event behind them for a tenth of a second
or more."""

from __future__ import annotations

import asyncio
import time

from meshplane.mesh.client import MeshClient
from meshplane.mesh.clients import HEARTBEAT_BURST
from meshplane.mesh.config import MeshConfig, PeerLimits
from meshplane.mesh.node import MeshNode
from tests.helpers import eventually

CLIENTS = 2 * HEARTBEAT_BURST + 2  # three bursts


async def test_client_heartbeats_go_a_burst_at_a_time_and_reach_every_client() -> None:
    # Ticked by hand; client heartbeats half a second apart.
    limits = PeerLimits(idle_timeout=2.0)
    node = MeshNode(MeshConfig(node_id="h", route_port=0, heartbeat_interval=1000, limits=limits))
    await node.start()
    clients: list[MeshClient] = []
    try:
        for _ in range(CLIENTS):
            clients.append(await MeshClient(node.route_url).connect())
        await eventually(lambda: len(node.clients.sessions) == CLIENTS)
        sessions = list(node.clients.sessions.values())
        before = [session.conn.stats.frames_out for session in sessions]
        node.tick(time.monotonic())  # no await in between: only this tick's sends are counted
        at_once = sum(s.conn.stats.frames_out > b for s, b in zip(sessions, before, strict=True))
        assert at_once == HEARTBEAT_BURST
        await eventually(
            lambda: all(s.conn.stats.frames_out > b for s, b in zip(sessions, before, strict=True)),
            what="every client's heartbeat",
        )
        answered = [session.conn.last_received for session in sessions]
        await asyncio.sleep(0)
        node.tick(time.monotonic() + node.clients.heartbeat_every)
        await eventually(
            lambda: all(s.conn.last_received > a for s, a in zip(sessions, answered, strict=True)),
            what="every client answering a later heartbeat",
        )
        assert all(s.client_id in node.clients.sessions for s in sessions)
    finally:
        for client in clients:
            await client.close()
        await node.close()


async def test_an_idle_client_hears_a_heartbeat_a_quarter_of_the_idle_timeout_apart() -> None:
    """Idle clients cost about what nats-server's do (a PING every 2 minutes), not a sealed frame each
    way every heartbeat interval: 10,000 idle clients at 1 s kept both processes so busy that newcomers'
    handshakes passed the 2 s auth timeout (issue 60). Often enough that none idles out."""
    config = MeshConfig(node_id="h", route_port=0, heartbeat_interval=1000)  # ticked by hand
    node = MeshNode(config)
    await node.start()
    client = await MeshClient(node.route_url).connect()
    try:
        await eventually(lambda: len(node.clients.sessions) == 1)
        (session,) = node.clients.sessions.values()
        every = config.limits.idle_timeout / 4
        start, sent = time.monotonic(), session.conn.stats.frames_out
        for step in range(int(every * 10)):  # the links' heartbeats, a tenth of a second apart
            node.tick(start + step / 10)
        assert session.conn.stats.frames_out - sent == 1
        node.tick(start + every)
        assert session.conn.stats.frames_out - sent == 2
        await client.flush()  # it answered, and it is still connected
        assert client.connected
    finally:
        await client.close()
        await node.close()
