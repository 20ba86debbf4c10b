"""A node's heartbeats to its clients go out a burst at a time, spread over the interval: thousands of
clients' heartbeats (and their answers) at once held every event behind them for a tenth of a second
or more."""

from __future__ import annotations

import asyncio
import time

from meshplane.mesh.client import MeshClient
from meshplane.mesh.clients import HEARTBEAT_BURST
from meshplane.mesh.config import MeshConfig
from meshplane.mesh.node import MeshNode
from tests.helpers import eventually

CLIENTS = 2 * HEARTBEAT_BURST + 2  # three bursts


async def test_client_heartbeats_go_a_burst_at_a_time_and_reach_every_client() -> None:
    node = MeshNode(MeshConfig(node_id="h", route_port=0, heartbeat_interval=0.5))  # route_url: the port got
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
        await eventually(
            lambda: all(s.conn.last_received > a for s, a in zip(sessions, answered, strict=True)),
            what="every client answering a later heartbeat",
        )
        assert all(s.client_id in node.clients.sessions for s in sessions)
    finally:
        for client in clients:
            await client.close()
        await node.close()
