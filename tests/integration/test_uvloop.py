"""meshplane on uvloop: as a library in a program that runs uvloop (uvicorn's default where it is
installed), and as the ``meshplane`` command's loop (``MESHPLANE_LOOP=uvloop``) in the servers it starts.

uvloop's transports do not subclass asyncio's transport classes; mesh nodes and clients asserted that
they did and failed every connection.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import uvloop

from meshplane import EventPlane, PlaneConfig, Scope
from meshplane.core.streamlog import StoredEvent, decode_event, scan_records
from meshplane.launchers import EtcdServer, MeshCluster, NatsServer, StreamsServerProcess
from meshplane.mesh.client import MeshClient
from meshplane.spark.http import SyncStreamsClient
from meshplane.streams.client import StreamsClient
from meshplane.streams.events import StreamEvent
from meshplane.streams.http.push import RoomPusher
from tests.helpers import eventually
from tests.support.cli import run_cli

EVENTS = 2_000


async def publish_and_receive(config: PlaneConfig) -> list[bytes]:
    """``EVENTS`` payloads, the first half in one ``publish_many``, the rest one at a time, as one subscriber
    received them."""
    scope = Scope.namespace(f"uv-{uuid.uuid4().hex[:8]}")
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(scope, "kv")
        pub = await plane.publisher(scope, "kv")
        await pub.wait_for_subscribers(1, timeout=10)
        payloads = [b"e%d" % i for i in range(EVENTS)]
        await pub.publish_many(payloads[: EVENTS // 2])
        for payload in payloads[EVENTS // 2 :]:
            await pub.publish(payload)
        received = [(await sub.next(timeout=10)).payload for _ in range(EVENTS)]
        assert sub.stats.gaps == 0
        return received


@pytest.mark.parametrize(
    ("transport", "discovery"),
    [("zmq", "file"), ("zmq", "etcd"), ("zmq-busypoll", "file"), ("nats", "file"), ("nats", "etcd")],
)
def test_the_event_plane_runs_on_uvloop(
    transport: str, discovery: str, tmp_path: Path, nats_server: NatsServer, etcd_server: EtcdServer
) -> None:
    config = PlaneConfig.from_env(
        {},
        event_plane=transport.removesuffix("-busypoll"),
        nats_server=nats_server.url,
        discovery_backend=discovery,
        file_kv=tmp_path / "kv",
        file_kv_poll_interval=0.02,
        etcd_endpoints=(etcd_server.endpoint,),
        busy_poll=0.01 if transport.endswith("busypoll") else 0.0,
    )
    received = uvloop.run(publish_and_receive(config))
    assert received == [b"e%d" % i for i in range(EVENTS)]


def test_mesh_nodes_on_uvloop_link_and_route_to_clients_on_uvloop() -> None:
    async def scenario(cluster: MeshCluster) -> list[tuple[str, bytes]]:
        await asyncio.to_thread(cluster.wait_linked)
        a = await MeshClient(cluster["a"].route_url).connect()
        b = await MeshClient(cluster["b"].route_url).connect()
        got: list[tuple[str, bytes]] = []
        try:
            b.subscribe("uv.>", lambda subject, body: got.append((subject, body)))
            await b.flush()

            async def heard() -> bool:  # interest reaches a after a round trip over the link
                await a.publish("uv.probe", b"")
                await a.flush()
                return bool(got)

            await eventually(heard, timeout=15, interval=0.05, what="a probe crossing from a to b")
            got.clear()
            for i in range(500):
                await a.publish("uv.n", b"%d" % i)
            await a.flush()
            await eventually(lambda: len(got) >= 500, timeout=15, what="500 events at b")
            return [event for event in got if event[0] != "uv.probe"]
        finally:
            await a.close()
            await b.close()

    with MeshCluster(2, env={"MESHPLANE_LOOP": "uvloop"}) as cluster:
        got = uvloop.run(scenario(cluster.start()))
    assert got == [("uv.n", b"%d" % i) for i in range(500)]


def test_an_unknown_loop_is_one_line_and_no_traceback() -> None:
    done = run_cli("ls", "--discovery", "mem", env={**os.environ, "MESHPLANE_LOOP": "trio"})
    assert done.returncode != 0
    assert done.stderr.strip() == "meshplane: error: MESHPLANE_LOOP='trio' is not one of asyncio, uvloop"


def test_a_caught_up_room_subscriber_is_written_in_the_publisher_s_turn_on_uvloop() -> None:
    """The room pusher's direct write (no task wake-up per subscriber) also takes uvloop's transports;
    it took only asyncio's, and every event went through the slower catch-up path."""

    async def scenario() -> bytes:
        ours, theirs = socket.socketpair()
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, ours)
        pusher = RoomPusher(
            cast(Any, None),
            transport,
            cast(Any, None),
            0,
            lambda e: b"",  # the catch-up path's rendering, not used by a direct write
            lambda e: b"frame%d" % e.offset,
            cast(Any, None),
        )
        event = StreamEvent(offset=0, timestamp_ms=0, body=StoredEvent(id="1", event_type="t"))
        assert pusher.offer(event), "the pusher did not write in the publisher's turn"
        assert pusher.cursor == 1
        theirs.setblocking(False)
        await eventually(lambda: _readable(theirs), what="the frame on the socket")
        written = theirs.recv(100)
        transport.close()
        theirs.close()
        return written

    assert uvloop.run(scenario()) == b"frame0"


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def test_a_streams_server_on_uvloop_serves_bulk_reads_without_sendfile() -> None:
    """uvloop has no ``loop.sendfile``: the records go through the response instead."""

    async def publish(url: str) -> None:
        async with StreamsClient(url) as client:
            await client.create_topic("uv", 1)
            await client.publish_batch("uv", [{"event_type": "t", "data": "x" * i} for i in range(300)])

    with StreamsServerProcess(env={"MESHPLANE_LOOP": "uvloop"}) as server:
        server.start()
        uvloop.run(publish(server.url))
        reader = SyncStreamsClient(server.url)
        try:
            data, start, end = reader.fetch_raw("uv", 0, 0, 1 << 20)
        finally:
            reader.close()
        assert "Traceback" not in server.log_path.read_text()
    scanned = scan_records(bytes(data), expected_offset=0, max_records=300)
    assert (start, end, scanned.problem) == (0, 300, None)
    assert [decode_event(r.payload).data for r in scanned.records] == ["x" * i for i in range(300)]
