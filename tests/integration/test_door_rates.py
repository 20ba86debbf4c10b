"""A VPN's and a user's publish rates hold for the NATS and MQTT doors' clients as for mesh clients:
what passes them is not published (counted in ``limits_refused``), on the Python path and on the direct
path alike (a learnt route must not carry a limited client's publishes past the check)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import aiohttp
import nats
import pytest

from meshplane.core.doors.mqtt_packets import V311, Connect, Publish, encode
from meshplane.errors import PermissionDenied
from meshplane.launchers import MeshCluster
from meshplane.launchers.base import free_port
from meshplane.mesh.client import MeshClient
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.support.mesh import Inbox, put_queue, queue_bodies, status
from tests.support.mqtt import Paho, connected

DAVE, BOB = "dave-pw-4c1e", "bob-pw-e8a0"


def _node(tmp_path: Path, vpns: str, door: str) -> tuple[MeshCluster, int]:
    """One node with ``vpns`` as its VPN file and a door (``--nats-port``, ``--mqtt-port``) on a free port."""
    path = tmp_path / "vpns.toml"
    path.write_text(vpns)
    port = free_port()
    return MeshCluster(1, extra_args=("--mesh-vpns", str(path), door, str(port))), port


async def test_a_users_publish_rate_holds_for_its_nats_clients(tmp_path: Path) -> None:
    made, port = _node(
        tmp_path,
        f'[vpns.A.users.dave]\nmax_events_per_second = 5\npassword_hash = "{hash_password(DAVE)}"\n'
        f'[vpns.A.users.bob]\npassword_hash = "{hash_password(BOB)}"\n',
        "--nats-port",
    )
    with made as cluster:
        node = cluster.start()["a"]
        seen = Inbox()
        bob = await MeshClient(node.route_url, vpn="A", user="bob", password=BOB).connect()
        nc = await nats.connect(f"nats://127.0.0.1:{port}", user="A/dave", password=DAVE, connect_timeout=30)
        try:
            bob.subscribe("rates.x", seen)
            await bob.flush()
            started = time.monotonic()
            for i in range(500):  # plain PUBs: after the first, a learnt route's
                await nc.publish("rates.x", b"%d" % i)
            await nc.flush()
            elapsed = time.monotonic() - started
            refused = (await status(node))["vpns"]["A"]["limits_refused"]
            await eventually(
                lambda: len(seen.events) >= 5, timeout=30, what="dave's first events within his rate"
            )
            allowed = 5 + 5 * (elapsed + 1)  # a second's burst, the rate since, a second's slack
            assert len(seen.events) <= allowed, f"{len(seen.events)} of dave's events past his 5 a second"
            assert refused.get("user_events_per_second", 0) >= 500 - allowed
            assert nc.is_connected  # the client stays
        finally:
            await nc.close()
            await bob.close()


async def test_a_vpns_publish_rate_holds_for_its_mqtt_clients(tmp_path: Path) -> None:
    made, port = _node(tmp_path, "[vpns.B]\nmax_events_per_second = 5\n", "--mqtt-port")
    with made as cluster:
        node = cluster.start()["a"]
        seen = Inbox()
        watcher = await MeshClient(node.route_url, vpn="B").connect()
        publisher = Paho(port, "flood", v5=True)
        publisher.client.username_pw_set("x@B")
        try:
            watcher.subscribe("rates.x", seen)
            await watcher.flush()
            await connected(publisher)
            started = time.monotonic()
            for i in range(300):
                publisher.client.publish("rates/x", b"%d" % i, qos=0)
            last = publisher.client.publish("rates/x", b"last", qos=1)
            await asyncio.to_thread(last.wait_for_publish, 30)  # answered: the QoS 0 ones were read
            elapsed = time.monotonic() - started
            await eventually(lambda: len(seen.events) >= 5, timeout=30, what="the events within B's rate")
            allowed = 5 + 5 * (elapsed + 1)
            assert len(seen.events) <= allowed, f"{len(seen.events)} of B's events past its 5 a second"
            refused = (await status(node))["vpns"]["B"]["limits_refused"]
            assert refused.get("events_per_second", 0) >= 301 - allowed
            assert publisher.client.is_connected()
        finally:
            publisher.close()
            await watcher.close()


async def test_a_rate_on_the_default_vpn_holds_for_its_nats_clients_direct_path(tmp_path: Path) -> None:
    """Anonymous NATS clients (the default VPN, no permissions) take the direct path: a rate there
    keeps their PUBs on the Python path, where it is checked."""
    made, port = _node(tmp_path, "[vpns.default]\nmax_events_per_second = 5\n", "--nats-port")
    with made as cluster:
        node = cluster.start()["a"]
        seen = Inbox()
        watcher = await MeshClient(node.route_url).connect()
        nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=30)
        try:
            watcher.subscribe("rates.x", seen)
            await watcher.flush()
            started = time.monotonic()
            for i in range(500):
                await nc.publish("rates.x", b"%d" % i)
            await nc.flush()
            elapsed = time.monotonic() - started
            await eventually(lambda: len(seen.events) >= 5, timeout=30, what="the events within its rate")
            allowed = 5 + 5 * (elapsed + 1)
            assert len(seen.events) <= allowed, f"{len(seen.events)} events past the default VPN's 5 a second"
            refused = (await status(node))["vpns"]["default"]["limits_refused"]
            assert refused.get("events_per_second", 0) >= 500 - allowed
        finally:
            await nc.close()
            await watcher.close()


async def test_a_guaranteed_nats_publish_past_a_rate_is_said_not_stored(tmp_path: Path) -> None:
    """A PUB on a queue's subject is guaranteed: flush() says it is stored. One past the VPN's rate is
    not, and the client is told (-ERR 'not stored: ...'), never left to believe it was."""
    made, port = _node(tmp_path, "[vpns.default]\nmax_events_per_second = 5\n", "--nats-port")
    with made as cluster:
        node = cluster.start()["a"]
        await put_queue(node, "rated", ["rated.>"])
        nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=30, allow_reconnect=False)
        try:
            for i in range(50):
                await nc.publish("rated.x", b"%d" % i)
            with contextlib.suppress(nats.errors.Error):
                await nc.flush()
            kept = await queue_bodies(node, "rated")
            assert len(kept) < 50
            await eventually(
                lambda: nc.last_error is not None, timeout=30, what="the client told of what was not stored"
            )
            assert "not stored" in str(nc.last_error)  # nats-py closes on it: it knows
        finally:
            await nc.close()


def _qos1_acked(port: int, count: int) -> list[int]:
    """A 3.1.1 client of VPN B sends ``count`` QoS 1 PUBLISHes at once: the packet ids acknowledged
    before the door answers them all or closes the connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(encode(Connect(V311, "burst", True, username="x@B"), V311))
        assert sock.recv(4) == b"\x20\x02\x00\x00"
        sock.sendall(
            b"".join(
                encode(Publish("rates/q", b"%d" % i, 1, False, False, i), V311) for i in range(1, count + 1)
            )
        )
        data = b""
        while len(data) < 4 * count:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return [
            int.from_bytes(data[i + 2 : i + 4], "big") for i in range(0, len(data) - 3, 4) if data[i] == 0x40
        ]
    finally:
        sock.close()


async def test_a_qos1_publish_past_a_rate_is_never_acknowledged_and_dropped_on_mqtt_311(
    tmp_path: Path,
) -> None:
    """MQTT 3.1.1 has no refusing PUBACK: a QoS 1 PUBLISH past the VPN's rate must not be acknowledged
    (its client sends it again after reconnecting), or an acknowledged event is lost."""
    made, port = _node(tmp_path, "[vpns.B]\nmax_events_per_second = 5\n", "--mqtt-port")
    with made as cluster:
        node = cluster.start()["a"]
        seen = Inbox()
        watcher = await MeshClient(node.route_url, vpn="B").connect()
        try:
            watcher.subscribe("rates.q", seen)
            await watcher.flush()
            acked = await asyncio.to_thread(_qos1_acked, port, 30)
            assert acked, "none of them acknowledged"
            await eventually(lambda: len(seen.events) >= len(acked), timeout=30, what="the acknowledged ones")
            assert {int(body) for _, body in seen.events} >= set(acked)
        finally:
            await watcher.close()


@pytest.mark.parametrize("vpn", ["default", "A"])
async def test_a_rate_a_reload_gives_a_vpn_holds_for_clients_already_on_the_direct_path(
    tmp_path: Path, vpn: str
) -> None:
    """A mesh client of a VPN (the default, or a named one) reads its events on the C direct path
    while the VPN has no rate; a reload that gives it one holds for that client from then on."""
    vpns = tmp_path / "vpns.toml"
    vpns.write_text(f"[vpns.{vpn}]\n")
    with MeshCluster(1, extra_args=("--mesh-vpns", str(vpns))) as cluster:
        node = cluster.start()["a"]
        seen = Inbox()
        watcher = await MeshClient(node.route_url, vpn=vpn).connect()
        publisher = await MeshClient(node.route_url, vpn=vpn).connect()
        try:
            watcher.subscribe("rates.r", seen)
            await watcher.flush()
            for i in range(200):  # the first read learns the route, the next take the direct path
                await publisher.publish("rates.r", b"before-%d" % i)
                if i % 50 == 0:
                    await publisher.flush()
            await publisher.flush()
            await eventually(lambda: len(seen.events) == 200, timeout=30, what="the events before")
            assert (await status(node))["counters"]["direct_path_events"] > 0
            vpns.write_text(f"[vpns.{vpn}]\nmax_events_per_second = 5\n")
            async with aiohttp.ClientSession() as http, http.post(f"{node.url}/mesh/vpns/reload") as answer:
                assert answer.status == 200, await answer.text()
            seen.events.clear()
            started = time.monotonic()
            for i in range(500):
                await publisher.publish("rates.r", b"after-%d" % i)
            with contextlib.suppress(PermissionDenied):
                await publisher.flush()
            elapsed = time.monotonic() - started
            await watcher.flush()
            allowed = 5 + 5 * (elapsed + 1)
            assert len(seen.events) <= allowed, f"{len(seen.events)} events past the VPN's new 5 a second"
        finally:
            await publisher.close()
            await watcher.close()
