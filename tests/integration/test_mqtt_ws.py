"""MQTT over WebSocket (issue 59: ``serve --mqtt-ws-port``) on a real node: paho-mqtt's websockets
transport unchanged, beside TCP clients, and raw aiohttp clients that split packets and batch them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from meshplane.core.doors.mqtt_packets import V311, Connect, PingReq, Publish, Subscribe, encode
from meshplane.launchers import MeshCluster
from tests.helpers import eventually
from tests.support.mesh import status
from tests.support.mqtt import Paho, connected, subscribed


@pytest.fixture
def node() -> Iterator[tuple[MeshCluster, int, int]]:
    with MeshCluster(1, node_args={"a": ("--mqtt-port", "0", "--mqtt-ws-port", "0")}) as cluster:
        cluster.start()
        yield cluster, cluster["a"].door_port("mqtt"), cluster["a"].door_port("mqtt_ws")


def in_order_per_qos(subscriber: Paho, prefix: bytes) -> None:
    """The ten messages ``prefix``0..9 (QoS 0 and 1 in turn), each at the QoS it was published with, in
    order within each QoS: MQTT orders a publisher's messages per topic and QoS (3.1.1 and 5.0, 4.6), so
    a QoS 0 message may pass a QoS 1 one published before it (seen once in CI), never another QoS 0."""
    for qos in (0, 1):
        got = [m[1] for m in subscriber.messages if m[2] == qos]
        assert got == [b"%s%d" % (prefix, i) for i in range(10) if i % 2 == qos], f"QoS {qos}"
    assert sorted(subscriber.payloads()) == sorted(b"%s%d" % (prefix, i) for i in range(10))


async def test_paho_over_websocket_exchanges_with_tcp_clients_and_keeps_a_persistent_session(
    node: tuple[MeshCluster, int, int],
) -> None:
    cluster, tcp_port, ws_port = node
    ws_sub = await connected(Paho(ws_port, "ws-sub", clean=False, websocket=True))
    tcp_sub = await connected(Paho(tcp_port, "tcp-sub", v5=True))
    ws_pub = await connected(Paho(ws_port, "ws-pub", v5=True, websocket=True))
    tcp_pub = await connected(Paho(tcp_port, "tcp-pub"))
    try:
        await subscribed(ws_sub, "from-tcp/#", 1)
        await subscribed(tcp_sub, "from-ws/+", 1)
        for i in range(10):  # QoS 0 and 1, both ways
            tcp_pub.client.publish("from-tcp/x", b"t%d" % i, qos=i % 2)
            info = ws_pub.client.publish("from-ws/y", b"w%d" % i, qos=i % 2)
            if i % 2:
                await asyncio.to_thread(info.wait_for_publish, 10)
        await eventually(lambda: len(ws_sub.payloads()) == 10, timeout=15, what="TCP -> WebSocket")
        await eventually(lambda: len(tcp_sub.payloads()) == 10, timeout=15, what="WebSocket -> TCP")
        in_order_per_qos(ws_sub, b"t")
        in_order_per_qos(tcp_sub, b"w")
        clients = {c["client_id"] for c in (await status(cluster["a"]))["mqtt"]["clients"]}
        assert clients == {"ws-sub", "tcp-sub", "ws-pub", "tcp-pub"}

        ws_sub.close()  # its session stays: QoS 1 messages wait in its queue
        await eventually(lambda: _gone(cluster, "ws-sub"), timeout=10, what="ws-sub gone")
        for i in range(5):
            info = tcp_pub.client.publish("from-tcp/later", b"later-%d" % i, qos=1)
            await asyncio.to_thread(info.wait_for_publish, 10)
        back = await connected(Paho(ws_port, "ws-sub", clean=False, websocket=True))
        try:
            assert back.connack[0][0]  # session present
            expected = [b"later-%d" % i for i in range(5)]
            await eventually(lambda: back.payloads() == expected, timeout=15, what="the session's queue")
        finally:
            back.close()
    finally:
        for client in (tcp_sub, ws_pub, tcp_pub):
            client.close()


async def _gone(cluster: MeshCluster, client_id: str) -> bool:
    return client_id not in {c["client_id"] for c in (await status(cluster["a"]))["mqtt"]["clients"]}


async def test_a_handshake_without_the_mqtt_subprotocol_is_refused(
    node: tuple[MeshCluster, int, int],
) -> None:
    cluster, _, ws_port = node
    url = f"http://127.0.0.1:{ws_port}/mqtt"
    async with aiohttp.ClientSession() as http:
        for protocols in ((), ("mqttv3.1", "chat")):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url, protocols=protocols)
            assert refused.value.status == 400
        async with http.get(url, headers={"Connection": "Upgrade", "Upgrade": "websocket"}) as response:
            assert response.status == 400
            assert 'subprotocol "mqtt"' in await response.text()
        async with http.ws_connect(url, protocols=("chat", "mqtt")) as ws:
            assert ws.protocol == "mqtt"
    counters = (await status(cluster["a"]))["mqtt"]["counters"]
    assert counters.get("ws_no_subprotocol") == 3


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    """Whole server packets in ``data``: (type, body)."""
    packets = []
    while data:
        length, shift, at = 0, 0, 1
        while data[at] & 0x80:
            length, shift, at = length | (data[at] & 0x7F) << shift, shift + 7, at + 1
        length |= data[at] << shift
        packets.append((data[0] >> 4, data[at + 1 : at + 1 + length]))
        data = data[at + 1 + length :]
    return packets


async def test_packets_split_across_websocket_messages_and_batched_in_one(
    node: tuple[MeshCluster, int, int],
) -> None:
    cluster, _, ws_port = node
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"http://127.0.0.1:{ws_port}/", protocols=("mqtt",)) as ws:
            connect = encode(Connect(V311, "raw-ws"), V311)
            for i in range(len(connect)):  # a byte per message
                await ws.send_bytes(connect[i : i + 1])
            assert _packets((await ws.receive(timeout=10)).data) == [(2, b"\x00\x00")]  # CONNACK
            batch = b"".join(
                encode(packet, V311)
                for packet in (
                    Subscribe(1, (("raw/t", 1),)),
                    PingReq(),
                )
            )
            publish = encode(Publish("raw/t", b"hello", 1, packet_id=7), V311)
            await ws.send_bytes(batch + publish[:3])  # two packets and the start of a third
            await ws.send_bytes(publish[3:])
            got: list[tuple[int, bytes]] = []
            while len(got) < 4:  # SUBACK, PINGRESP, PUBACK, the PUBLISH back
                message = await ws.receive(timeout=10)
                assert message.type is aiohttp.WSMsgType.BINARY, message
                got += _packets(message.data)
            kinds = sorted(kind for kind, _ in got)
            assert kinds == [3, 4, 9, 13]
            assert (4, b"\x00\x07") in got
            assert any(kind == 3 and body.endswith(b"hello") for kind, body in got)
        async with http.ws_connect(f"http://127.0.0.1:{ws_port}/", protocols=("mqtt",)) as ws:
            await ws.send_str("CONNECT")  # text: not MQTT over WebSocket
            closed = await ws.receive(timeout=10)
            assert closed.type is aiohttp.WSMsgType.CLOSE
            assert closed.data == 1003
    counters = (await status(cluster["a"]))["mqtt"]["counters"]
    assert counters.get("ws_text_frame") == 1


async def test_a_silent_handshake_and_an_oversized_message_are_cut_and_counted(
    node: tuple[MeshCluster, int, int],
) -> None:
    cluster, _, ws_port = node
    reader, writer = await asyncio.open_connection("127.0.0.1", ws_port)
    writer.write(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    assert await asyncio.wait_for(reader.read(), 30) == b""  # cut at the CONNECT deadline
    writer.close()
    url = f"http://127.0.0.1:{ws_port}/"
    async with aiohttp.ClientSession() as http, http.ws_connect(url, protocols=("mqtt",)) as ws:
        await ws.send_bytes(encode(Connect(V311, "big"), V311))
        assert (await ws.receive(timeout=10)).type is aiohttp.WSMsgType.BINARY  # CONNACK
        await ws.send_bytes(b"\x30" + b"x" * (1024 * 1024 + 8))  # past the door's max packet
        closed = await ws.receive(timeout=10)
        assert closed.type is aiohttp.WSMsgType.CLOSE
        assert closed.data == 1009
    counters = (await status(cluster["a"]))["mqtt"]["counters"]
    assert counters.get("ws_handshake_timeout") == 1
    assert counters.get("ws_message_too_big") == 1


async def test_websocket_only_door_with_the_nodes_tls_takes_wss(tmp_path: Path) -> None:
    from tests.mesh_pki import MeshCA

    ca = MeshCA(tmp_path)
    ca.issue("a", "meshplane://node/c1/a", "127.0.0.1")
    tls = ("--mesh-tls-cert", str(tmp_path / "a.pem"), "--mesh-tls-key", str(tmp_path / "a.key"))
    with MeshCluster(1, node_args={"a": (*tls, "--mqtt-ws-port", "0")}) as cluster:
        cluster.start()
        assert "mqtt_port" not in cluster["a"].announced["mesh"]  # no TCP door asked for
        client = Paho(cluster["a"].door_port("mqtt_ws"), "wss", v5=True, websocket=True)
        client.client.tls_set(str(tmp_path / "ca.pem"))
        await connected(client)
        try:
            await subscribed(client, "t/#", 1)
            info = client.client.publish("t/x", b"over wss", qos=1)
            await asyncio.to_thread(info.wait_for_publish, 10)
            await eventually(lambda: client.payloads() == [b"over wss"], timeout=10, what="over wss")
        finally:
            client.close()
        async with aiohttp.ClientSession() as http:  # no plain WebSocket beside it
            with pytest.raises(aiohttp.ClientError):
                await http.ws_connect(
                    f"http://127.0.0.1:{cluster['a'].door_port('mqtt_ws')}/", protocols=("mqtt",)
                )


@pytest.mark.timeout(370)  # its waits add up to 350 s
async def test_refused_connects_leave_nothing_behind(node: tuple[MeshCluster, int, int]) -> None:
    """A refused CONNECT (read with reading paused for its answer) ends its connection: more of them than
    the unproven connections one address may hold, then a good one is still taken."""
    cluster, _, ws_port = node
    url = f"http://127.0.0.1:{ws_port}/"
    refused = encode(Connect(V311, "", clean=False), V311)  # 3.1.1: no client id needs a clean session
    async with aiohttp.ClientSession() as http:
        for i in range(34):  # --mesh-max-unauthenticated-per-address: 32
            async with http.ws_connect(url, protocols=("mqtt",)) as ws:
                await ws.send_bytes(refused)
                first = await ws.receive(timeout=5)
                assert first.type is aiohttp.WSMsgType.BINARY, (i, first)
                assert _packets(first.data) == [(2, b"\x00\x02")]
                assert (await ws.receive(timeout=5)).type is aiohttp.WSMsgType.CLOSE
        async with http.ws_connect(url, protocols=("mqtt",)) as ws:
            await ws.send_bytes(encode(Connect(V311, "fine"), V311))
            assert _packets((await ws.receive(timeout=10)).data) == [(2, b"\x00\x00")]
    assert (await status(cluster["a"]))["mqtt"]["counters"].get("connect_refused") == 34


async def test_handshakes_from_one_address_are_capped_before_the_upgrade() -> None:
    """Connections from one address that never finish their handshake hold at most its share of the
    unproven slots: past it a newcomer is cut at once (counted), the ones before it are still waiting
    for their deadline, and once they are gone a client from that address is taken again."""
    args = ("--mqtt-ws-port", "0", "--mesh-max-unauthenticated-per-address", "4")
    with MeshCluster(1, node_args={"a": args}) as cluster:
        cluster.start()
        ws_port = cluster["a"].door_port("mqtt_ws")
        held = [await asyncio.open_connection("127.0.0.1", ws_port) for _ in range(4)]
        for _, writer in held:
            writer.write(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        reader, writer = await asyncio.open_connection("127.0.0.1", ws_port)
        assert await _cut(reader)  # the fifth
        writer.close()
        assert not any(r.at_eof() for r, _ in held)  # ... before the first four's deadline
        counters = (await status(cluster["a"]))["mqtt"]["counters"]
        assert counters.get("ws_closed_address_limit") == 1
        for _, writer in held:
            writer.close()
        await eventually(lambda: _answered(ws_port), timeout=10, what="a handshake from it answered")
        client = await connected(Paho(ws_port, "after", websocket=True))
        client.close()


async def _cut(reader: asyncio.StreamReader) -> bool:
    """Whether the node closed the connection unanswered (its abort may come as a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), 30) == b""
    except ConnectionResetError:
        return True


async def _answered(port: int) -> bool:
    """Whether a whole request (no subprotocol offered) gets its answer, not a cut."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n")
        return (await asyncio.wait_for(reader.read(12), 10)).startswith(b"HTTP/1.1 400")
    except ConnectionResetError:  # cut: the address's earlier ones not yet seen gone
        return False
    finally:
        writer.close()
