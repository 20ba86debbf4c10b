"""Hostile clients against a real node's NATS door: each test is an attack that once worked."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from meshplane.core.doors.nats_protocol import wrap
from meshplane.core.mesh.frames import FLAG_NATS_ENVELOPE, encode_event
from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually


class Node:
    """One node with a NATS door and an MQTT door."""

    def __init__(self) -> None:
        self.cluster = MeshCluster(1, node_args={"a": ("--nats-port", "0", "--mqtt-port", "0")})

    @property
    def nats_port(self) -> int:
        return self.cluster["a"].door_port("nats")

    @property
    def mqtt_port(self) -> int:
        return self.cluster["a"].door_port("mqtt")

    @property
    def route_url(self) -> str:
        return self.cluster["a"].route_url


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    doors = Node()
    with doors.cluster:
        doors.cluster.start()
        yield doors


def raw_nats(port: int, *lines: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    assert sock.recv(4096).startswith(b"INFO ")
    sock.sendall(b'CONNECT {"verbose":false,"headers":true}\r\n' + b"".join(lines) + b"PING\r\n")
    answer = b""
    while b"PONG\r\n" not in answer:
        answer += sock.recv(4096)
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float = 10) -> bytes:
    got, deadline = b"", time.monotonic() + timeout
    while marker not in got and time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return got


def msgs(stream: bytes) -> list[tuple[list[bytes], bytes]]:
    """The MSGs of a server's stream, read as a NATS client does: by the length on their line."""
    found = []
    while stream:
        line, _, stream = stream.partition(b"\r\n")
        words = line.split()
        if words and words[0] == b"MSG":
            size = int(words[-1])
            found.append((words, stream[:size]))
            stream = stream[size + 2 :]
    return found


async def test_a_mesh_client_cannot_inject_protocol_lines_into_nats_clients_through_an_envelope(
    node: Node,
) -> None:
    """A mesh client may set any flag on its EVENT: with 0x40 and an "envelope" whose reply subject
    holds a space, CR LF and a whole forged MSG, a NATS subscriber read three messages (one forged, on
    a subject nobody published) in place of one. The reply must be a subject, or the body is a
    plain payload."""
    sub = await asyncio.to_thread(raw_nats, node.nats_port, b"SUB inject.> 1\r\n")
    client = await MeshClient(node.route_url).connect()
    try:
        forged_reply = "x 5\r\nhello\r\nMSG inject.forged 1 4\r\nevil\r\nMSG inject.tail 1 _INBOX.a"
        body = wrap(forged_reply, None, b"hello")
        assert client._conn is not None
        client._conn.send(encode_event("hostile", "inject.here", 1, 0, body, FLAG_NATS_ENVELOPE))
        await client.publish("inject.end", b"end")
        got = await asyncio.to_thread(read_until, sub, b"inject.end")
        assert [words[1] for words, _ in msgs(got)] == [b"inject.here", b"inject.end"], got
        assert msgs(got)[0] == ([b"MSG", b"inject.here", b"1", str(len(body)).encode()], body)
    finally:
        await client.close()
        sub.close()


async def test_an_mqtt_subscriber_gets_a_nats_requests_payload_not_the_door_envelope(node: Node) -> None:
    """A NATS request (PUB with a reply subject) or HPUB travels as an envelope (flag 0x40): an MQTT
    subscriber got the envelope's bytes (``NATS\\x01``, lengths, the reply) as its payload in place of
    what the NATS client published."""
    got: list[bytes] = []
    subscribed: list[object] = []
    paho = mqtt.Client(CallbackAPIVersion.VERSION2, "reader", protocol=mqtt.MQTTv311)
    paho.on_message = lambda c, u, m: got.append(bytes(m.payload))
    paho.on_subscribe = lambda c, u, mid, codes, p: subscribed.append(codes)
    await asyncio.to_thread(paho.connect, "127.0.0.1", node.mqtt_port)
    paho.loop_start()
    try:
        paho.subscribe("req/#", 0)
        await eventually(lambda: bool(subscribed), timeout=10, what="SUBACK")
        pub = await asyncio.to_thread(
            raw_nats,
            node.nats_port,
            b"PUB req.plain 5\r\nplain\r\n",
            b"PUB req.asked _INBOX.abc 5\r\nasked\r\n",
            b"HPUB req.headed 18 23\r\nNATS/1.0\r\nA: b\r\n\r\nhdred\r\n",
        )
        await eventually(lambda: len(got) >= 3, timeout=10, what="the three messages")
        assert got == [b"plain", b"asked", b"hdred"]
        pub.close()
    finally:
        paho.loop_stop()
        paho.disconnect()


async def test_queue_group_members_count_among_their_vpns_subscriptions(tmp_path: Path) -> None:
    """A VPN's ``max_subscriptions`` bounds what its clients make every node hold: a NATS client got
    past it with queue-group subscriptions (each a holder, a pattern and a ``$NQ`` interest on the
    mesh), without limit but the connection's 10,000."""
    from meshplane.mesh.vpns import hash_password

    vpns = tmp_path / "vpns.toml"
    vpns.write_text(
        f'[vpns.B]\nmax_subscriptions = 3\n[vpns.B.users.bob]\npassword_hash = "{hash_password("pw")}"\n'
    )
    with MeshCluster(
        1, extra_args=("--mesh-vpns", str(vpns)), node_args={"a": ("--nats-port", "0")}
    ) as cluster:
        port = cluster.start()["a"].door_port("nats")
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert sock.recv(4096).startswith(b"INFO ")
        subs = b"".join(f"SUB q.{i} workers {i}\r\n".encode() for i in range(10))
        sock.sendall(b'CONNECT {"user":"bob","pass":"pw"}\r\n' + subs + b"PING\r\n")
        answer = await asyncio.to_thread(read_until, sock, b"PONG\r\n", 30)
        sock.close()
        assert answer.count(b"Maximum Subscriptions Exceeded") == 7, answer


@pytest.mark.timeout(180)  # its waits add up to 150.5 s
async def test_a_vpn_clients_longest_subject_breaks_no_link(tmp_path: Path) -> None:
    """A client's subject may be 1,024 bytes; in a VPN the mesh carries it with the VPN's prefix
    (``$vpn:B.``), and a peer's frame reader refuses a subject past 1,024 bytes as a broken stream:
    one PUB (or SUB) of a tenant's NATS client broke the node's link, for every tenant (a reply subject
    is published in the VPN too, by its responder or an imported service's). Such a subject is refused
    at the door (pedantic: -ERR), and the link stays up."""
    from meshplane.mesh.vpns import hash_password
    from tests.support.mesh import status

    vpns = tmp_path / "vpns.toml"
    vpns.write_text(f'[vpns.B.users.bob]\npassword_hash = "{hash_password("pw")}"\n')
    args = ("--mesh-vpns", str(vpns), "--nats-port", "0")
    with MeshCluster(2, extra_args=args) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        ports = {name: cluster[name].door_port("nats") for name in "ab"}

        def login(port: int, *lines: bytes) -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            assert sock.recv(4096).startswith(b"INFO ")
            sock.sendall(b'CONNECT {"user":"bob","pass":"pw","pedantic":true}\r\n' + b"".join(lines))
            sock.sendall(b"PING\r\n")
            assert b"PONG\r\n" in read_until(sock, b"PONG\r\n", 30)
            return sock

        subscriber = await asyncio.to_thread(login, ports["b"], b"SUB > 1\r\n")
        publisher = await asyncio.to_thread(login, ports["a"])
        try:

            async def reaches_b() -> bool:
                publisher.sendall(b"PUB warm 1\r\nw\r\n")
                return b"MSG warm" in await asyncio.to_thread(read_until, subscriber, b"MSG warm", 0.5)

            await eventually(reaches_b, timeout=30, what="B's interest at a")
            before = {link["peer"]: link["connected_secs"] for link in (await status(cluster["a"]))["links"]}
            long = ("x" * 99 + ".") * 10 + "x" * 18  # 1,018 bytes: with ".y" and the prefix, 1,027
            publisher.sendall(
                f"SUB {long}.> 2\r\nPUB {long}.y 1\r\nx\r\nPUB svc {long}.y 1\r\nx\r\n"  # its reply too
                "PUB after 1\r\nz\r\nPING\r\n".encode()
            )
            answer = await asyncio.to_thread(read_until, publisher, b"PONG\r\n", 30)
            assert answer.count(b"-ERR 'Invalid") == 3, answer
            assert b"MSG after" in await asyncio.to_thread(read_until, subscriber, b"MSG after", 30)
            links = (await status(cluster["a"]))["links"]
            assert all(
                link["state"] == "up" and link["connected_secs"] >= before[link["peer"]] for link in links
            )
            assert not (await status(cluster["b"]))["frame_errors"]
        finally:
            subscriber.close()
            publisher.close()
