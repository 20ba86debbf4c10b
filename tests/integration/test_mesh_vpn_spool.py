"""A Message VPN's ``max_spool_bytes`` on real nodes (issue 58): while the node holding its queue is
down, a VPN's guaranteed events past its share of the publisher's node's spools are refused to the
publisher with the reason (never acknowledged, so never lost), counted and shown by VPN; another VPN
keeps publishing; once the spool drains, the VPN publishes again, and everything acknowledged arrived."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nats
import pytest

from meshplane.core.doors.mqtt_packets import V311, Connect, Publish, encode
from meshplane.errors import TransportError
from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.integration.test_mesh_guaranteed import link_state
from tests.integration.test_mesh_vpns import put_queue_in
from tests.support.mesh import interest_reached, queue_bodies, status

LIMIT = 30_000
BODY = 1000
ALICE = "alice-spool-password"
BOB = "bob-spool-password"


@contextlib.asynccontextmanager
async def _queue_node_down(
    tmp_path: Path, vpns_file: str, vpns: tuple[str, ...] = ("A",), *more: str
) -> AsyncIterator[MeshCluster]:
    """Nodes a and b, each VPN's queue ``orders`` on b, then b killed: a spools what the queues want."""
    path = tmp_path / "vpns.toml"
    path.write_text(vpns_file)
    with MeshCluster(2, extra_args=("--mesh-vpns", str(path), *more)) as cluster:
        cluster.start()
        a, b = cluster["a"], cluster["b"]
        await asyncio.to_thread(cluster.wait_linked)
        for vpn in vpns:
            await put_queue_in(b, "orders", ["orders.>"], vpn)
            await interest_reached(a, "b", f"$G.$vpn:{vpn}.orders.>")
        b.kill(signal.SIGKILL)
        await eventually(lambda: link_state(a, "b", "down"), timeout=15, what="a sees b down")
        yield cluster


async def _publish_until_refused(client: MeshClient) -> tuple[list[bytes], str]:
    """Guaranteed events of BODY bytes until one is refused: those acknowledged, and why."""
    accepted: list[bytes] = []
    refused = ""
    for i in range(LIMIT // BODY + 5):
        body = b"%04d" % i + b"x" * (BODY - 4)
        try:
            await client.publish("orders.eu", body, guaranteed=True)
        except TransportError as exc:
            refused = str(exc)
            break
        accepted.append(body)
    assert f"(its limit {LIMIT}): not stored" in refused, f"{len(accepted)} events and none refused"
    assert LIMIT // (BODY + 200) <= len(accepted) <= LIMIT // BODY
    return accepted, refused


async def _drained_then_stored(cluster: MeshCluster, client: MeshClient, acknowledged: list[bytes]) -> None:
    """b back: a's spool drains, ``client`` publishes again, and b's queue holds every acknowledged
    event of A once (``acknowledged`` and the one after)."""
    a, b = cluster["a"], cluster["b"]
    b.start()
    await asyncio.to_thread(cluster.wait_linked)

    async def drained() -> bool:
        return int((await status(a))["vpns"]["A"]["spool_bytes"]) == 0

    await eventually(drained, timeout=30, what="A's spooled events confirmed by b")
    await client.publish("orders.eu", b"after", guaranteed=True)

    async def arrived() -> bool:
        return len(await queue_bodies(b, "A:orders")) >= len(acknowledged) + 1

    await eventually(arrived, timeout=30, what="every acknowledged event of A in its queue")
    assert await queue_bodies(b, "A:orders") == [*acknowledged, b"after"]  # none lost, none twice, in order


@pytest.mark.timeout(120)
async def test_a_vpns_spool_bytes_past_its_limit_are_refused_and_nothing_acknowledged_is_lost(
    tmp_path: Path,
) -> None:
    vpns = f"[vpns.A]\nmax_spool_bytes = {LIMIT}\n[vpns.B]\n"
    async with _queue_node_down(tmp_path, vpns, ("A", "B")) as cluster:
        a = cluster["a"]
        in_a = await MeshClient(a.route_url, vpn="A").connect()
        in_b = await MeshClient(a.route_url, vpn="B").connect()
        try:
            accepted, refused = await _publish_until_refused(in_a)
            assert "Message VPN 'A': its guaranteed events hold" in refused
            for _ in range(50):  # B's share is its own: nothing of it refused
                await in_b.publish("orders.eu", b"b" * BODY, guaranteed=True)

            shown = (await status(a))["vpns"]
            assert len(accepted) * BODY <= shown["A"]["spool_bytes"] <= LIMIT
            assert shown["A"]["limits_refused"] == {"spool_bytes": 1}
            assert shown["A"]["limits"]["max_spool_bytes"] == LIMIT
            assert shown["B"]["spool_bytes"] >= 50 * BODY
            async with aiohttp.ClientSession() as http, http.get(f"{a.url}/metrics") as response:
                metrics = await response.text()
            assert f'meshplane_mesh_vpn_spool_bytes{{vpn="A"}} {float(shown["A"]["spool_bytes"])}' in metrics
            assert 'meshplane_mesh_vpn_limits_refused_total{limit="spool_bytes",vpn="A"} 1.0' in metrics
            await _drained_then_stored(cluster, in_a, accepted)  # A's share is free again
        finally:
            await in_a.close()
            await in_b.close()


USERS = (
    f'[vpns.A.users.alice]\npassword_hash = "{hash_password(ALICE)}"\nmax_spool_bytes = {LIMIT}\n'
    f'[vpns.A.users.bob]\npassword_hash = "{hash_password(BOB)}"\n'
)


@pytest.mark.timeout(120)
async def test_a_users_spool_bytes_past_its_limit_are_refused_and_other_users_keep_publishing(
    tmp_path: Path,
) -> None:
    """A user's ``max_spool_bytes``: counted at publish time on the node its client is connected to."""
    async with _queue_node_down(tmp_path, USERS) as cluster:
        a = cluster["a"]
        alice = await MeshClient(a.route_url, vpn="A", user="alice", password=ALICE).connect()
        bob = await MeshClient(a.route_url, vpn="A", user="bob", password=BOB).connect()
        try:
            accepted, refused = await _publish_until_refused(alice)
            assert "user 'alice' of Message VPN 'A': its guaranteed events hold" in refused, refused
            bobs = [b"b%04d" % i + b"y" * BODY for i in range(50)]
            for body in bobs:  # the VPN has no limit: bob's events are not alice's
                await bob.publish("orders.eu", body, guaranteed=True)
            shown = (await status(a))["vpns"]["A"]
            assert shown["limits_refused"] == {"user_spool_bytes": 1}
            assert shown["spool_bytes"] >= len(accepted) * BODY + 50 * BODY  # the VPN's: both users'
            assert len(accepted) * BODY <= shown["users_spool_bytes"]["alice"] <= LIMIT
            assert shown["users_spool_bytes"]["bob"] >= 50 * BODY
            await _drained_then_stored(cluster, alice, [*accepted, *bobs])  # alice's share is free again
        finally:
            await alice.close()
            await bob.close()


@pytest.mark.timeout(120)
async def test_a_users_spool_bytes_hold_for_its_nats_clients(tmp_path: Path) -> None:
    """The NATS door's clients are held to their user's ``max_spool_bytes`` as mesh clients: a PUB
    on a queue's subject past it is not stored, and the client is told (-ERR 'not stored: ...')."""
    async with _queue_node_down(tmp_path, USERS, ("A",), "--nats-port", "0") as cluster:
        a = cluster["a"]
        url = f"nats://127.0.0.1:{a.door_port('nats')}"
        nc = await nats.connect(
            url, user="A/alice", password=ALICE, connect_timeout=30, allow_reconnect=False
        )
        try:
            for i in range(2 * LIMIT // BODY):
                await nc.publish("orders.eu", b"%04d" % i + b"x" * (BODY - 4))
            with contextlib.suppress(nats.errors.Error):
                await nc.flush()

            async def refused() -> bool:
                shown = (await status(a))["vpns"]["A"]
                return bool(shown["limits_refused"].get("user_spool_bytes"))

            await eventually(refused, timeout=30, what="alice's publishes past her spool bytes refused")
            assert (await status(a))["vpns"]["A"]["users_spool_bytes"]["alice"] <= LIMIT
            await eventually(lambda: nc.last_error is not None, timeout=30, what="alice told")
            assert "not stored" in str(nc.last_error)
        finally:
            await nc.close()


def _mqtt_publish_until_closed(port: int, count: int) -> None:
    """A 3.1.1 client logged in as alice sends ``count`` QoS 1 PUBLISHes of BODY bytes, then reads
    until the door closes it (a QoS 1 PUBLISH it cannot store: 3.1.1 has no refusing PUBACK)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(
            encode(Connect(V311, "alice-mqtt", True, username="alice@A", password=ALICE.encode()), V311)
        )
        assert sock.recv(4) == b"\x20\x02\x00\x00"
        for i in range(1, count + 1):
            sock.sendall(encode(Publish("orders/eu", b"x" * BODY, 1, False, False, i), V311))
        while sock.recv(4096):
            pass
    except OSError:
        pass  # closed under a send: what the door does past the limit
    finally:
        sock.close()


@pytest.mark.timeout(120)
async def test_a_users_spool_bytes_hold_for_its_mqtt_clients(tmp_path: Path) -> None:
    """The MQTT door's QoS 1 PUBLISHes are held to their user's ``max_spool_bytes`` too."""
    async with _queue_node_down(tmp_path, USERS, ("A",), "--mqtt-port", "0") as cluster:
        a = cluster["a"]
        await asyncio.to_thread(_mqtt_publish_until_closed, a.door_port("mqtt"), 2 * LIMIT // BODY)

        async def refused() -> bool:
            shown = (await status(a))["vpns"]["A"]
            return bool(shown["limits_refused"].get("user_spool_bytes"))

        await eventually(refused, timeout=30, what="alice's QoS 1 publishes past her spool bytes refused")
        assert 0 < (await status(a))["vpns"]["A"]["users_spool_bytes"]["alice"] <= LIMIT
