"""MQTT retained messages as an MQTT user expects them (issue 59), on real nodes with paho-mqtt: on
disk (back after a SIGKILL of their node), and the same on every node (a node started later learns
them; a clear made while a node was away wins there too)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from meshplane.core.doors.mqtt_packets import V5, Connect, Publish, encode
from meshplane.core.doors.mqtt_retained import MAX_RETAINED, Record, encode_body
from meshplane.core.mesh.frames import FrameType, encode_event
from meshplane.launchers import MeshCluster, StreamsServerProcess
from tests.helpers import eventually
from tests.integration.test_mesh_gateways_guaranteed import TwoClusters, all_up, running
from tests.integration.test_mesh_mqtt import read_packets
from tests.mesh_peers import RawPeer
from tests.support.mesh import interest_reached, status
from tests.support.mqtt import Paho, connected, subscribed


@pytest.fixture
def trio() -> Iterator[MeshCluster]:
    node_args: dict[str, tuple[str, ...]] = {node: ("--mqtt-port", "0") for node in "abc"}
    with MeshCluster(3, node_args=node_args) as cluster:
        cluster.start()
        yield cluster


async def _retained(cluster: MeshCluster | TwoClusters, node: str) -> int:
    return int((await status(cluster[node]))["mqtt"]["retained"])


async def _publish_retained(port: int, messages: dict[str, bytes]) -> None:
    """Each message retained at QoS 1, acknowledged (PUBACK) before the next."""
    pub = await connected(Paho(port, "retainer"))
    try:
        for topic, payload in messages.items():
            info = pub.client.publish(topic, payload, qos=1, retain=True)
            await asyncio.to_thread(info.wait_for_publish, 20)
            assert info.is_published()
    finally:
        pub.close()


async def _retained_seen(port: int, client_id: str, expected: int) -> dict[str, bytes]:
    """What a new subscription to everything gets, once ``expected`` retained messages came."""
    sub = await connected(Paho(port, client_id))
    try:
        await subscribed(sub, "#", 1)
        await eventually(lambda: len(sub.messages) >= expected, timeout=20, what="the retained messages")
        await asyncio.sleep(0.3)  # nothing more than expected (a stale copy would come with them)
        assert all(message[3] for message in sub.messages)  # each with the retain flag
        return {message[0]: message[1] for message in sub.messages}
    finally:
        sub.close()


async def test_acknowledged_retained_messages_survive_a_sigkill_of_their_node() -> None:
    with MeshCluster(1, node_args={"a": ("--mqtt-port", "0")}) as cluster:
        cluster.start()
        port = cluster["a"].door_port("mqtt")
        messages = {f"config/lamp{i}": b"colour-%d" % i for i in range(30)}
        await _publish_retained(port, messages)
        await _publish_retained(port, {"config/lamp3": b"", "config/lamp4": b"changed"})
        del messages["config/lamp3"]
        messages["config/lamp4"] = b"changed"
        cluster["a"].kill(signal.SIGKILL)
        cluster["a"].start()
        assert await _retained(cluster, "a") == 29
        port = cluster["a"].door_port("mqtt")
        assert await _retained_seen(port, "after-kill", 29) == messages


async def test_a_node_started_after_a_retained_publish_gives_it_to_a_new_subscriber(
    trio: MeshCluster,
) -> None:
    cluster = trio
    await asyncio.to_thread(cluster.wait_linked)
    cluster["c"].kill(signal.SIGKILL)
    await _publish_retained(cluster["a"].door_port("mqtt"), {"config/fan": b"on", "config/door": b"shut"})
    cluster["c"].start()
    await interest_reached(cluster["a"], "c", "$mqtt.#")

    async def learnt() -> bool:
        return await _retained(cluster, "c") == 2

    await eventually(learnt, timeout=15, what="c to learn the retained messages")
    got = await _retained_seen(cluster["c"].door_port("mqtt"), "late", 2)
    assert got == {"config/fan": b"on", "config/door": b"shut"}


async def test_a_clear_on_one_node_wins_everywhere_even_on_a_node_that_was_away(trio: MeshCluster) -> None:
    cluster = trio
    await asyncio.to_thread(cluster.wait_linked)
    await interest_reached(cluster["a"], "c", "$mqtt.#")
    await _publish_retained(cluster["a"].door_port("mqtt"), {"config/fan": b"on", "config/door": b"shut"})

    async def everywhere(count: int) -> bool:
        return all([await _retained(cluster, node) == count for node in "abc"])

    await eventually(lambda: everywhere(2), timeout=15, what="both retained on every node")
    cluster["c"].kill(signal.SIGKILL)  # c keeps both on its disk
    await _publish_retained(cluster["b"].door_port("mqtt"), {"config/fan": b""})  # cleared while c is away
    cluster["c"].start()
    await interest_reached(cluster["b"], "c", "$mqtt.#")
    await eventually(lambda: everywhere(1), timeout=15, what="the clear on every node, c too")
    got = await _retained_seen(cluster["c"].door_port("mqtt"), "after-clear", 1)
    assert got == {"config/door": b"shut"}


async def test_a_retained_publish_whose_journal_write_fails_is_not_acknowledged_its_retry_kept() -> None:
    """The journal's writes fail with ENOSPC (the file is /dev/full): the QoS 1 PUBLISH gets a
    refusing PUBACK (MQTT 5), nothing is lost that was acknowledged; the client's retry is written
    (the journal rewritten whole, as after any failed append) and survives a SIGKILL."""
    with MeshCluster(1, node_args={"a": ("--mqtt-port", "0")}) as cluster:
        cluster.start()
        node = cluster["a"]
        (node.data_dir / "mesh" / "mqtt-retained.log").symlink_to("/dev/full")
        port = node.door_port("mqtt")

        def publish_twice() -> list[tuple[int, int, bytes]]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(encode(Connect(V5, "full-disk"), V5))
                assert read_packets(sock, 1)[0][0] == 2  # CONNACK
                acks = []
                for packet_id in (1, 2):
                    sock.sendall(encode(Publish("config/fan", b"on", 1, True, packet_id=packet_id), V5))
                    acks += read_packets(sock, 1)
                return acks

        first, second = await asyncio.to_thread(publish_twice)
        assert first[0] == second[0] == 4  # PUBACKs
        reasons = [body[2] if len(body) > 2 else 0 for _, _, body in (first, second)]  # none: success
        assert reasons[0] >= 0x80  # refused: not on disk
        assert reasons[1] == 0
        node.kill(signal.SIGKILL)
        node.start()
        assert await _retained_seen(node.door_port("mqtt"), "after-full", 1) == {"config/fan": b"on"}


async def test_a_cluster_whose_gateway_was_away_learns_the_other_clusters_retained_messages() -> None:
    """Retained messages cross gateways as live events do; b1 (cluster B's gateway) is down while one
    is published in cluster A: once the gateway link is up again, a1 sends it what A holds, and b1
    spreads it in B, so a subscriber on b2 (up all along) gets it."""
    with running(TwoClusters(extra_args=("--mqtt-port", "0"))) as topo:
        await all_up(topo)
        topo["b1"].kill(signal.SIGKILL)
        await _publish_retained((await status(topo["a2"]))["mqtt"]["port"], {"fleet/truck1": b"parked"})
        topo["b1"].start()
        await all_up(topo)

        async def learnt() -> bool:
            return await _retained(topo, "b2") == 1

        await eventually(learnt, timeout=20, what="b2 to learn the retained message")
        port = (await status(topo["b2"]))["mqtt"]["port"]
        assert await _retained_seen(port, "far", 1) == {"fleet/truck1": b"parked"}


async def test_a_lying_peer_cannot_make_a_node_hold_more_retained_messages_than_its_bounds() -> None:
    """A member that floods ``$mqtt.`` with records past the node's 10,000 topics, stamps one a day
    ahead (it would win forever) and sends a body that is no record: the node keeps its bounds,
    refuses the rest and counts each."""
    with MeshCluster(1, node_args={"a": ("--mqtt-port", "0")}) as cluster:
        cluster.start()
        node = cluster["a"]
        peer = await asyncio.to_thread(RawPeer(node.route_url, "liar").authenticate)
        try:
            await asyncio.to_thread(peer.read_until, FrameType.SYNC_REQ)
            now = int(time.time() * 1000)
            flood = [
                encode_event(
                    "liar", f"$mqtt.flood.{i}", i + 1, now, encode_body(Record("", b"x", 1, now, "b"))
                )
                for i in range(MAX_RETAINED + 100)
            ]
            ahead = Record("", b"forever", 1, now + 24 * 3600 * 1000, "b")
            flood.append(encode_event("liar", "$mqtt.config.fan", len(flood) + 1, now, encode_body(ahead)))
            flood.append(encode_event("liar", "$mqtt.config.door", len(flood) + 1, now, b"\xc1 no record"))
            for start in range(0, len(flood), 1000):
                peer.send(b"".join(flood[start : start + 1000]))

            async def counted() -> bool:
                mqtt = (await status(node))["mqtt"]
                return bool(
                    mqtt["counters"].get("retained_bad") == 1 and mqtt["retained_learnt"].get("invalid")
                )

            await eventually(counted, timeout=30, what="every record looked at")
            mqtt = (await status(node))["mqtt"]
            assert mqtt["retained"] == MAX_RETAINED
            assert mqtt["retained_learnt"] == {"kept": MAX_RETAINED, "full": 100, "invalid": 1}
            # Its own clients are served on: a topic it holds takes their newer message (a new one
            # would be refused, counted: the VPN's share is full, whoever filled it).
            await _publish_retained(mqtt["port"], {"flood/5": b"mine"})
            sub = await connected(Paho(mqtt["port"], "own"))
            try:
                await subscribed(sub, "flood/5", 1)
                await eventually(lambda: bool(sub.messages), timeout=10, what="the retained message")
                assert sub.messages[0][:2] == ("flood/5", b"mine")
            finally:
                sub.close()
        finally:
            peer.close()


async def test_a_node_back_from_a_sigkill_learns_all_of_a_full_store_it_missed() -> None:
    """10,000 retained messages (the node's bound) published while b was down: b learns every one,
    though the catch-up outlasts the pair's first connection (both dial; the pair keeps one)."""
    with MeshCluster(2, node_args={node: ("--mqtt-port", "0") for node in "ab"}) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        cluster["b"].kill(signal.SIGKILL)
        pub = await connected(Paho(cluster["a"].door_port("mqtt"), "fleet"))
        try:
            for i in range(MAX_RETAINED):
                pub.client.publish(f"fleet/truck{i}", b"parked %d" % i, qos=0, retain=True)

            async def held(node: str) -> bool:
                return await _retained(cluster, node) == MAX_RETAINED

            await eventually(lambda: held("a"), timeout=30, what="a to hold them all")
        finally:
            pub.close()
        cluster["b"].start()
        await eventually(lambda: held("b"), timeout=30, what="b to learn them all")


async def _publish_retained_as(port: int, username: str, topic: str, payload: bytes) -> None:
    pub = Paho(port, f"pub-{username}")
    pub.client.username_pw_set(username)
    await connected(pub)
    try:
        info = pub.client.publish(topic, payload, qos=1, retain=True)
        await asyncio.to_thread(info.wait_for_publish, 20)
        assert info.is_published()
    finally:
        pub.close()


@pytest.mark.timeout(150)
async def test_a_vpn_left_out_of_dmr_keeps_its_retained_messages_in_its_cluster(tmp_path: Path) -> None:
    """VPN L has ``dmr = false``: its retained messages reach the other node of its cluster but never
    cluster B, neither live nor in the catch-up of a gateway link coming up (``$mqtt.$vpn:L.`` was taken
    for the default VPN's, which crosses), while VPN A's cross as before."""
    vpns = tmp_path / "vpns.toml"
    vpns.write_text("[vpns.A]\n[vpns.L]\ndmr = false\n")
    with running(TwoClusters(extra_args=("--mesh-vpns", str(vpns), "--mqtt-port", "0"))) as topo:
        await all_up(topo)
        a2 = (await status(topo["a2"]))["mqtt"]["port"]
        await _publish_retained_as(a2, "x@L", "secret/live", b"L's")  # live, the gateway up
        await _publish_retained_as(a2, "x@A", "fleet/live", b"A's")
        await eventually(lambda: _held(topo, "b2", 1), timeout=20, what="A's retained message in B")
        await eventually(lambda: _held(topo, "a1", 2), timeout=20, what="both in A's other node")
        topo["b1"].kill(signal.SIGKILL)
        await _publish_retained_as(a2, "x@L", "secret/away", b"L's")  # the catch-up's
        await _publish_retained_as(a2, "x@A", "fleet/away", b"A's")
        await eventually(lambda: _held(topo, "a1", 4), timeout=20, what="all four in A's other node")
        topo["b1"].start()
        await all_up(topo)
        await eventually(lambda: _held(topo, "b2", 2), timeout=20, what="A's second in B")
        await asyncio.sleep(0.5)  # L's would have come with A's
        for node in ("b1", "b2"):
            assert (await status(topo[node]))["mqtt"]["retained"] == 2, node


async def _held(topo: TwoClusters, node: str, count: int) -> bool:
    return await _retained(topo, node) >= count


async def _reload(node: StreamsServerProcess) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{node.url}/mesh/vpns/reload") as answer:
        assert answer.status == 200, await answer.text()


async def test_a_vpn_a_reload_adds_has_its_retained_messages_on_every_node(tmp_path: Path) -> None:
    """The door took the ``$mqtt.`` subjects of the VPNs it started with only: a VPN a reload added kept
    its retained messages on the node they were published on (a subscriber on the other node got
    nothing, nor did it after a restart's catch-up)."""
    vpns = tmp_path / "vpns.toml"
    vpns.write_text("[vpns.A]\n")
    args = ("--mqtt-port", "0", "--mesh-vpns", str(vpns))
    with MeshCluster(2, node_args={node: args for node in "ab"}) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        vpns.write_text("[vpns.A]\n[vpns.N]\n")
        for node in "ab":
            await _reload(cluster[node])
        await interest_reached(cluster["a"], "b", "$mqtt.$vpn:N.#")
        await _publish_retained_as(cluster["a"].door_port("mqtt"), "x@N", "new/lamp", b"on")
        await eventually(
            lambda: _held_in(cluster, "b", 1), timeout=20, what="b to learn N's retained message"
        )


async def _held_in(cluster: MeshCluster, node: str, count: int) -> bool:
    return await _retained(cluster, node) >= count
