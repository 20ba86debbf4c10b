"""A node that stops answering while its TCP connection stays open (a frozen process, a partition that
drops packets) is noticed by its clients: they probe it after ``keepalive`` seconds of silence and
reconnect after twice that, instead of waiting on a connection that will never speak again."""

from __future__ import annotations

import asyncio
import signal

from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually


async def test_a_client_notices_a_frozen_node_and_comes_back_when_it_wakes() -> None:
    with MeshCluster(1) as cluster:
        node = cluster.start()["a"]
        got: list[bytes] = []
        client = await MeshClient(node.route_url, timeout=5, keepalive=0.5).connect()
        try:
            client.subscribe("wake.>", lambda _subject, body: got.append(body))
            await client.flush()
            # A connection with nothing to say still hears from a live node: the probes are answered.
            await eventually(lambda: client.connected, timeout=5, what="the idle client still connected")
            node.kill(signal.SIGSTOP)
            try:
                await eventually(lambda: not client.connected, timeout=20, what="the frozen node noticed")
            finally:
                node.kill(signal.SIGCONT)
            await eventually(lambda: client.connected, timeout=30, what="the client back on the woken node")
            await client.flush()  # its subscription was made again on the new connection
            await client.publish("wake.up", b"again")

            await eventually(
                lambda: got == [b"again"], timeout=10, what="an event through the new connection"
            )
        finally:
            await client.close()


async def test_an_idle_client_of_a_live_node_keeps_its_connection() -> None:
    with MeshCluster(1) as cluster:
        node = cluster.start()["a"]
        client = await MeshClient(node.route_url, timeout=5, keepalive=0.2).connect()
        try:
            conn = client._conn
            # Silence from the application for fifteen keepalive periods: the node answers each probe.
            await asyncio.sleep(3.0)
            assert client._conn is conn, "a live node's answers to the probes must keep the connection"
            await client.flush()
        finally:
            await client.close()
