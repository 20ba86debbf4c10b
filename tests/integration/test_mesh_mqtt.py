"""The MQTT door (issue 59) on real nodes, with foreign clients unchanged: paho-mqtt and Debian's
mosquitto_pub / mosquitto_sub, beside meshplane's own MeshClient."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from meshplane.core.doors.mqtt_packets import (
    V5,
    V311,
    Connect,
    Disconnect,
    PubAck,
    Publish,
    Subscribe,
    Will,
    encode,
)
from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.integration.test_mesh_gateways_guaranteed import (
    TwoClusters,
    all_up,
    delivered,
    queue_known,
    running,
)
from tests.support.mesh import Inbox, interest_reached, put_queue, queue_bodies, status
from tests.support.mqtt import Paho, connected, subscribed


@contextlib.contextmanager
def mqtt_trio() -> Iterator[tuple[MeshCluster, dict[str, int]]]:
    node_args: dict[str, tuple[str, ...]] = {node: ("--mqtt-port", "0") for node in "abc"}
    with MeshCluster(3, node_args=node_args) as cluster:
        cluster.start()
        yield cluster, {node: cluster[node].door_port("mqtt") for node in "abc"}


@pytest.fixture
def trio() -> Iterator[tuple[MeshCluster, dict[str, int]]]:
    """Three nodes of a test's own: for one that kills a node or counts every client of one."""
    with mqtt_trio() as both:
        yield both


@pytest.fixture(scope="module")
def shared_trio() -> Iterator[tuple[MeshCluster, dict[str, int]]]:
    """Three nodes for the tests that neither stop a node nor count all its clients: each has its own
    client ids and topics, closes its clients and counts only what it alone causes."""
    with mqtt_trio() as both:
        yield both


async def test_mqtt_pub_on_a_reaches_mqtt_on_b_a_mesh_client_and_back(
    trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = trio
    await asyncio.to_thread(cluster.wait_linked)
    sub_b = await connected(Paho(ports["b"], "sub-b", v5=True))
    await subscribed(sub_b, "sensors/+/temp", 1)
    everything = await connected(Paho(ports["c"], "all-c"))
    await subscribed(everything, "sensors/#")
    mesh = await MeshClient(cluster["c"].route_url).connect()
    inbox = Inbox()
    mesh.subscribe("sensors.>", inbox)
    await mesh.flush(propagated=True)
    await interest_reached(cluster["a"], "b", "sensors.*.temp")
    await interest_reached(cluster["a"], "c", "sensors.#")
    pub_a = await connected(Paho(ports["a"], "pub-a"))
    try:
        for i in range(20):
            info = pub_a.client.publish("sensors/kitchen/temp", b"%d" % i, qos=1)
            await asyncio.to_thread(info.wait_for_publish, 10)
        pub_a.client.publish("sensors/kitchen/humidity", b"h", qos=0)
        expected = [b"%d" % i for i in range(20)]
        await eventually(lambda: sub_b.payloads() == expected, timeout=15, what="MQTT sub on b")
        assert {m[2] for m in sub_b.messages} == {1}  # guaranteed events at the subscription's QoS 1
        await eventually(lambda: len(everything.payloads()) == 21, timeout=15, what="'#' on c")
        assert {m[2] for m in everything.messages} == {0}
        await eventually(lambda: len(inbox.events) == 21, timeout=15, what="the MeshClient on c")
        assert inbox.events[0] == ("sensors.kitchen.temp", b"0")
        assert sorted(b for _, b in inbox.events) == sorted([*expected, b"h"])

        await mesh.publish("sensors.garden.temp", b"from the mesh")  # and the other way round
        await eventually(lambda: b"from the mesh" in sub_b.payloads(), timeout=10, what="mesh -> MQTT")
        assert ("sensors/garden/temp", b"from the mesh") in [(m[0], m[1]) for m in sub_b.messages]
        answer = await status(cluster["b"])
        assert [c["client_id"] for c in answer["mqtt"]["clients"]] == ["sub-b"]
        async with aiohttp.ClientSession() as http, http.get(f"{cluster['b'].url}/metrics") as response:
            metrics = await response.text()
        assert "meshplane_mesh_mqtt_clients 1.0" in metrics
        assert 'meshplane_mesh_mqtt_events_total{event="connections"} 1.0' in metrics
    finally:
        for client in (sub_b, everything, pub_a):
            client.close()
        await mesh.close()


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="make mosquitto installs Debian's clients")
async def test_mosquitto_pub_and_sub_through_two_nodes(
    shared_trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = shared_trio
    await asyncio.to_thread(cluster.wait_linked)
    sub = await asyncio.create_subprocess_exec(
        *(
            "mosquitto_sub",
            "-p",
            str(ports["b"]),
            "-t",
            "plant/+/state",
            "-q",
            "1",
            "-C",
            "3",
            "-v",
            "-i",
            "ms",
        ),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(lambda: _clients(cluster, "b"), timeout=15, what="mosquitto_sub connected")
        await interest_reached(cluster["a"], "b", "plant.*.state")
        for i, version in enumerate(("mqttv311", "mqttv5", "mqttv311")):
            pub = await asyncio.create_subprocess_exec(
                *("mosquitto_pub", "-p", str(ports["a"]), "-t", f"plant/m{i}/state", "-m", f"on{i}"),
                *("-q", "1", "-V", version),
            )
            assert await asyncio.wait_for(pub.wait(), 20) == 0
        out, _ = await asyncio.wait_for(sub.communicate(), 20)
        assert out.decode().splitlines() == ["plant/m0/state on0", "plant/m1/state on1", "plant/m2/state on2"]
    finally:
        if sub.returncode is None:
            sub.kill()
            await sub.wait()


async def _retained(cluster: MeshCluster, node: str, count: int) -> bool:
    return bool((await status(cluster[node]))["mqtt"]["retained"] == count)


async def _clients(cluster: MeshCluster, node: str) -> bool:
    return bool((await status(cluster[node]))["mqtt"]["clients"])


async def test_retained_messages_reach_later_subscribers_on_other_nodes(
    shared_trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = shared_trio
    await asyncio.to_thread(cluster.wait_linked)
    await interest_reached(cluster["a"], "b", "$mqtt.#")
    pub = await connected(Paho(ports["a"], "retainer"))
    info = pub.client.publish("config/lamp", b"blue", qos=1, retain=True)
    await asyncio.to_thread(info.wait_for_publish, 10)

    async def retained_at_b() -> bool:
        return bool((await status(cluster["b"]))["mqtt"]["retained"] == 1)

    await eventually(retained_at_b, timeout=10, what="retained at b")
    later = await connected(Paho(ports["b"], "later"))
    try:
        await subscribed(later, "config/#", 1)
        await eventually(lambda: bool(later.messages), timeout=10, what="the retained message")
        assert later.messages[0][:4] == ("config/lamp", b"blue", 1, True)
        pub.client.publish("config/lamp", b"", retain=True)  # an empty retained payload clears it
        await eventually(lambda: len(later.messages) == 2, timeout=10, what="the clearing publish")
        await eventually(lambda: _retained(cluster, "b", 0), timeout=10, what="cleared at b too")
        again = await connected(Paho(ports["b"], "again"))
        await subscribed(again, "config/#")
        # Retained messages go out as the SUBSCRIBE is answered: before anything published after it.
        pub.client.publish("config/marker", b"after", qos=1)
        await eventually(lambda: bool(again.messages), timeout=10, what="the marker")
        assert [m[:2] for m in again.messages] == [("config/marker", b"after")]
        again.close()
    finally:
        pub.close()
        later.close()


async def test_a_will_is_published_when_its_client_vanishes_not_when_it_disconnects(
    shared_trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = shared_trio
    await asyncio.to_thread(cluster.wait_linked)
    watcher = await connected(Paho(ports["b"], "watcher"))
    await subscribed(watcher, "status/#", 1)
    await interest_reached(cluster["a"], "b", "status.#")
    polite = await connected(Paho(ports["a"], "polite", will=("status/polite", b"gone")))
    polite.close()  # DISCONNECT: no will
    raw = socket.create_connection(("127.0.0.1", ports["a"]))
    raw.sendall(encode(Connect(V311, "rude", will=Will("status/rude", b"vanished", 1)), V311))
    assert raw.recv(4) == b"\x20\x02\x00\x00"
    raw.close()  # no DISCONNECT: the will goes
    try:
        await eventually(lambda: watcher.payloads() == [b"vanished"], timeout=10, what="the will")
        await asyncio.sleep(0.3)
        assert watcher.payloads() == [b"vanished"]
    finally:
        watcher.close()


async def test_qos1_with_a_persistent_session_survives_a_sigkill_of_the_subscribers_node(
    trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = trio
    await asyncio.to_thread(cluster.wait_linked)
    keeper = await connected(Paho(ports["b"], "keeper", clean=False))
    await subscribed(keeper, "orders/#", 1)
    await interest_reached(cluster["a"], "b", "$G.orders.#")  # its session's queue, known at a
    pub = await connected(Paho(ports["a"], "orders-pub"))
    acknowledged: list[bytes] = []

    async def publish(count: int, start: int) -> None:
        for i in range(start, start + count):
            body = b"order-%d" % i
            info = pub.client.publish("orders/eu", body, qos=1)
            await asyncio.to_thread(info.wait_for_publish, 20)
            assert info.is_published()
            acknowledged.append(body)

    try:
        await publish(100, 0)
        await eventually(lambda: len(set(keeper.payloads())) == 100, timeout=15, what="the first 100")
        keeper.client.loop_stop()  # its socket is left to die with the node
        cluster["b"].kill(signal.SIGKILL)
        await publish(300, 100)  # acknowledged by a: spooled for b's queue
        cluster["b"].start()
        back = await connected(Paho(ports["b"], "keeper", clean=False))
        assert back.connack[0][0]  # the session was there
        await eventually(
            lambda: set(back.payloads()) | set(keeper.payloads()) >= set(acknowledged),
            timeout=40,
            what="every acknowledged PUBLISH after the reconnect",
        )
        assert {m[2] for m in back.messages} == {1}
        back.close()
    finally:
        pub.close()


async def test_hostile_clients_are_cut_with_a_reason_and_the_node_serves_on(
    shared_trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = shared_trio
    port = ports["a"]

    def closed_after(data: bytes, timeout: float = 10) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            if data:
                sock.sendall(data)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            return answer

    assert await asyncio.to_thread(closed_after, b"GET / HTTP/1.1\r\n\r\n") == b""  # garbage
    assert await asyncio.to_thread(closed_after, b"\x10\xff\xff\xff\x7f") == b""  # 256 MB CONNECT
    assert await asyncio.to_thread(closed_after, b"\x82\x05\x00\x01\x00\x01a") == b""  # no CONNECT
    assert await asyncio.to_thread(closed_after, b"") == b""  # nothing at all: the CONNECT timeout
    v5 = encode(Connect(V5, "bad"), V5)
    answer = await asyncio.to_thread(closed_after, v5 + encode(Publish("a/+", b"", 0), V5))
    assert answer.startswith(b"\x20")  # CONNACK, then DISCONNECT 0x90
    assert b"\xe0" in answer
    assert answer[answer.index(b"\xe0") + 2] == 0x90
    qos2 = await asyncio.to_thread(closed_after, v5 + encode(Publish("a/b", b"", 2, packet_id=1), V5))
    assert qos2[qos2.index(b"\xe0") + 2] == 0x9B  # QoS not supported

    client = await connected(Paho(port, "fine", v5=True))
    try:
        await subscribed(client, "a.b/#")  # '.' cannot map
        await subscribed(client, "ok/+", 2)  # QoS 2 granted as 1
        assert [int(code.value) for code in client.suback[0]] == [0x8F]
        assert [int(code.value) for code in client.suback[1]] == [1]
        info = client.client.publish("x//y", b"", qos=1)  # an empty level
        await asyncio.to_thread(info.wait_for_publish, 10)
        counters = (await status(cluster["a"]))["mqtt"]["counters"]
        assert counters.get("too_large", 0) >= 1
        for reason in ("no_connect", "connect_timeout", "bad_topic", "qos2", "bad_filter"):
            assert counters.get(reason, 0) >= 1, reason
    finally:
        client.close()


async def test_a_slow_consumer_is_cut_and_counted(shared_trio: tuple[MeshCluster, dict[str, int]]) -> None:
    cluster, ports = shared_trio
    port = ports["a"]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(encode(Connect(V311, "slow"), V311))
    assert sock.recv(4) == b"\x20\x02\x00\x00"
    sock.sendall(encode(Subscribe(1, (("big", 0),)), V311))  # then never read again
    await eventually(lambda: _clients(cluster, "a"), timeout=10, what="the slow client")
    mesh = await MeshClient(cluster["a"].route_url).connect()
    try:
        payload = b"x" * 60_000

        async def cut() -> bool:
            for _ in range(50):
                await mesh.publish("big", payload)
            await mesh.flush()
            return bool((await status(cluster["a"]))["mqtt"]["counters"].get("slow_consumer"))

        await eventually(cut, timeout=60, interval=0.05, what="the slow consumer cut")
    finally:
        sock.close()
        await mesh.close()


async def test_vpn_users_log_in_and_are_held_to_their_permissions_and_the_token_guards_the_rest(
    tmp_path: Path,
) -> None:
    from meshplane.mesh.vpns import hash_password

    vpns = tmp_path / "vpns.toml"
    hashed = await asyncio.to_thread(hash_password, "s3cret")
    vpns.write_text(
        f'[vpns.team-a.users.alice]\npassword_hash = "{hashed}"\n'
        'publish = { deny = ["orders.audit.>"] }\nsubscribe = { allow = ["orders.>"] }\n'
    )
    args = ("--mesh-vpns", str(vpns), "--mqtt-port", "0")
    with MeshCluster(1, node_args={"a": args}, env={"MESHPLANE_MQTT_TOKEN": "door-token"}) as cluster:
        port = cluster.start()["a"].door_port("mqtt")

        def connack(username: str, password: str, level: int = V311) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                packet = Connect(level, "who", username=username, password=password.encode())
                sock.sendall(encode(packet, level))
                return sock.recv(64)

        assert await asyncio.to_thread(connack, "alice@team-a", "wrong") == b"\x20\x02\x00\x04"
        assert await asyncio.to_thread(connack, "mallory@team-a", "s3cret") == b"\x20\x02\x00\x04"
        assert await asyncio.to_thread(connack, "anyone", "not-the-token") == b"\x20\x02\x00\x04"
        assert await asyncio.to_thread(connack, "alice@nowhere", "s3cret") == b"\x20\x02\x00\x04"
        assert await asyncio.to_thread(connack, "alice@team-a", "s3cret") == b"\x20\x02\x00\x00"
        assert await asyncio.to_thread(connack, "anyone", "door-token") == b"\x20\x02\x00\x00"

        alice = Paho(port, "alice-sub", v5=True)
        alice.client.username_pw_set("alice@team-a", "s3cret")
        await connected(alice)
        other = Paho(port, "default-sub")
        other.client.username_pw_set("someone", "door-token")
        await connected(other)
        try:
            await subscribed(alice, "orders/#", 1)  # '#' takes "orders" too, which orders.> does not allow
            await subscribed(alice, "orders/+", 1)
            await subscribed(alice, "payments/+")
            assert [[int(c.value) for c in codes] for codes in alice.suback] == [[0x87], [1], [0x87]]
            await subscribed(other, "orders/#")
            denied = alice.client.publish("orders/audit/x", b"no", qos=1)
            await asyncio.to_thread(denied.wait_for_publish, 10)
            ok = alice.client.publish("orders/eu", b"team-a", qos=1)
            await asyncio.to_thread(ok.wait_for_publish, 10)
            other.client.publish("orders/eu", b"default", qos=0)
            await eventually(lambda: alice.payloads() == [b"team-a"], timeout=10, what="team-a's own event")
            await eventually(lambda: other.payloads() == [b"default"], timeout=10, what="the default VPN's")
            await asyncio.sleep(0.3)
            assert alice.payloads() == [b"team-a"]  # VPNs apart; the denied one never published
            assert other.payloads() == [b"default"]
            answer = await status(cluster["a"])
            assert answer["vpns"]["team-a"]["violations"] == {"alice": 3}
            assert answer["vpns"]["team-a"]["logins_refused"] >= 2
        finally:
            alice.close()
            other.close()


def test_a_door_proving_nothing_is_refused_where_mesh_clients_must_prove_a_secret(tmp_path: Path) -> None:
    env = {"MESHPLANE_MESH_MEMBER_SECRET": "m" * 32, "MESHPLANE_MESH_CLIENT_SECRET": "c" * 32}
    node = MeshCluster(1, node_args={"a": ("--mqtt-port", "0")}, env=env)
    with node, pytest.raises(Exception, match="MESHPLANE_MQTT_TOKEN"):
        node.start(timeout=20)


async def test_an_mqtt_publisher_reaches_a_queue_a_mesh_client_and_mqtt_in_another_cluster() -> None:
    """MQTT on a2 (cluster A): a queue on a1 stores every QoS 1 message in order; a MeshClient and an
    MQTT subscriber on b2, behind the gateways, get them too."""
    with running(TwoClusters(extra_args=("--mqtt-port", "0"))) as topo:
        await all_up(topo)
        ports = {name: (await status(topo[name]))["mqtt"]["port"] for name in ("a2", "b2")}
        await put_queue(topo["a1"], "from-mqtt", ["fleet.>"])
        mesh = await MeshClient(topo["b2"].route_url).connect()
        inbox = Inbox()
        mesh.subscribe("fleet.>", inbox)
        await mesh.flush(propagated=True)
        far = await connected(Paho(ports["b2"], "far"))
        await subscribed(far, "fleet/#", 1)
        await eventually(
            lambda: queue_known(topo["a2"], "a1", "fleet.>"), timeout=15, what="a1's queue at a2"
        )

        async def b_interest() -> bool:
            gateways = (await status(topo["a1"]))["patterns"]["gateways"]
            return "fleet.#" in str(gateways) and "fleet.>" in str(gateways)

        await eventually(b_interest, timeout=15, what="cluster B's interest at A's gateway")
        pub = await connected(Paho(ports["a2"], "truck"))
        try:
            bodies = [b"pos-%d" % i for i in range(50)]
            for body in bodies:
                info = pub.client.publish("fleet/truck1/pos", body, qos=1)
                await asyncio.to_thread(info.wait_for_publish, 20)
            await eventually(lambda: delivered(topo["a1"], "from-mqtt", 50), timeout=20, what="a1's queue")
            assert await queue_bodies(topo["a1"], "from-mqtt") == bodies  # once each, in order
            await eventually(lambda: len(inbox.events) == 50, timeout=20, what="the MeshClient in cluster B")
            assert [b for _, b in inbox.events] == bodies
            await eventually(lambda: far.payloads() == bodies, timeout=20, what="MQTT in cluster B")
        finally:
            pub.close()
            far.close()
            await mesh.close()


def read_packets(sock: socket.socket, count: int) -> list[tuple[int, int, bytes]]:
    """``count`` packets from a server: (type, flags, body)."""
    buffer, packets = b"", list[tuple[int, int, bytes]]()
    while len(packets) < count:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed after {len(packets)} packets")
        buffer += chunk
        while len(buffer) >= 2:
            length, shift, at = 0, 0, 1
            while buffer[at] & 0x80:
                length |= (buffer[at] & 0x7F) << shift
                shift, at = shift + 7, at + 1
            length |= buffer[at] << shift
            at += 1
            if len(buffer) < at + length:
                break
            packets.append((buffer[0] >> 4, buffer[0] & 0x0F, buffer[at : at + length]))
            buffer = buffer[at + length :]
    return packets


async def test_unacknowledged_qos1_messages_come_again_with_dup_to_a_returning_session(
    shared_trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    _, ports = shared_trio
    port = ports["a"]

    def session(acknowledge: bool, expected: int) -> tuple[bytes, list[tuple[int, int, bytes]]]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(encode(Connect(V311, "dupper", clean=False), V311))
            connack = sock.recv(4)
            if not acknowledge and expected == 0:  # the first time: subscribe
                sock.sendall(encode(Subscribe(1, (("dup/#", 1),)), V311))
                assert read_packets(sock, 1)[0][0] == 9  # SUBACK
                return connack, []
            packets = read_packets(sock, expected)
            if acknowledge:
                for _, _, body in packets:
                    sock.sendall(encode(PubAck(int.from_bytes(body[2 + body[1] : 4 + body[1]], "big")), V311))
                sock.sendall(encode(Disconnect(), V311))
            return connack, packets

    first, _ = await asyncio.to_thread(session, False, 0)
    assert first == b"\x20\x02\x00\x00"  # no session before
    pub = await connected(Paho(port, "dup-pub"))
    try:
        for i in range(3):
            info = pub.client.publish("dup/x", b"m%d" % i, qos=1)
            await asyncio.to_thread(info.wait_for_publish, 10)
        _, sent = await asyncio.to_thread(session, False, 3)  # received, never acknowledged
        assert [(kind, flags) for kind, flags, _ in sent] == [(3, 0b0010)] * 3  # QoS 1, no DUP
        again, resent = await asyncio.to_thread(session, True, 3)
        assert again == b"\x20\x02\x01\x00"  # session present
        assert [(kind, flags) for kind, flags, _ in resent] == [(3, 0b1010)] * 3  # QoS 1, DUP
        assert [body[-2:] for _, _, body in resent] == [b"m0", b"m1", b"m2"]
        info = pub.client.publish("dup/x", b"m3", qos=1)
        await asyncio.to_thread(info.wait_for_publish, 10)
        _, last = await asyncio.to_thread(session, True, 1)  # the acknowledged ones are not sent again
        assert [(flags, body[-2:]) for _, flags, body in last] == [(0b0010, b"m3")]
    finally:
        pub.close()


async def test_with_the_nodes_tls_the_door_takes_tls_clients_with_a_certificate_only(tmp_path: Path) -> None:
    from tests.mesh_pki import MeshCA

    ca = MeshCA(tmp_path)
    ca.issue("a", "meshplane://node/c1/a", "127.0.0.1")
    ca.issue("sensor", "meshplane://client/sensor")
    tls = ("--mesh-tls-cert", str(tmp_path / "a.pem"), "--mesh-tls-key", str(tmp_path / "a.key"))
    args = (*tls, "--mesh-tls-ca", str(tmp_path / "ca.pem"), "--mqtt-port", "0")
    with MeshCluster(1, node_args={"a": args}) as cluster:
        port = cluster.start()["a"].door_port("mqtt")
        client = Paho(port, "tls-sensor")
        client.client.tls_set(
            str(tmp_path / "ca.pem"), str(tmp_path / "sensor.pem"), str(tmp_path / "sensor.key")
        )
        await connected(client)
        try:
            await subscribed(client, "t/#")
            client.client.publish("t/x", b"over tls")
            await eventually(lambda: client.payloads() == [b"over tls"], timeout=10, what="over TLS")
        finally:
            client.close()

        def plain() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(encode(Connect(V311, "plain"), V311))
                try:
                    return sock.recv(64)
                except ConnectionResetError:
                    return b""

        assert not (await asyncio.to_thread(plain)).startswith(b"\x20")  # no CONNACK in clear


async def test_an_mqtt5_session_expiry_past_the_nodes_cap_is_capped_and_the_connack_says_so() -> None:
    args = ("--mqtt-port", "0", "--mqtt-session-expiry", "60")
    with MeshCluster(1, node_args={"a": args}) as cluster:
        port = cluster.start()["a"].door_port("mqtt")
        sock = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 30)
        try:
            connect = Connect(V5, "capped", False, properties={0x11: 3600})  # Session Expiry Interval
            await asyncio.to_thread(sock.sendall, encode(connect, V5))
            connack = await asyncio.to_thread(sock.recv, 4096)
            assert connack[:4] == b"\x20" + bytes([connack[1]]) + b"\x00\x00"  # no session before, success
            assert b"\x11\x00\x00\x00\x3c" in connack  # the Session Expiry Interval granted: 60 s
        finally:
            sock.close()
