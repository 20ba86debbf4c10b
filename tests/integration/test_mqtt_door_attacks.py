"""Hostile MQTT clients against a real node's MQTT door: each test is an attack that once worked."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from pathlib import Path

from meshplane.core.doors.mqtt_packets import (
    V311,
    Connect,
    Disconnect,
    PingReq,
    Publish,
    Subscribe,
    Unsubscribe,
    encode,
)
from meshplane.launchers import MeshCluster
from meshplane.launchers.base import free_port
from tests.helpers import eventually
from tests.support.mesh import status
from tests.support.mqtt import Paho, connected, subscribed

CONNACK_OK = b"\x20\x02\x00\x00"


def _connect(port: int, client_id: str, username: str | None = None, clean: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(encode(Connect(V311, client_id, clean, username=username), V311))
    assert sock.recv(4) in (CONNACK_OK, b"\x20\x02\x01\x00")  # (a session present)
    return sock


def _read_all(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(1 << 20):
                return
        except TimeoutError:
            continue
        except OSError:
            return


async def test_one_subscribe_matching_every_retained_message_many_times_does_not_hold_the_node() -> None:
    """10,000 retained topics, then one SUBSCRIBE of 1,000 filters (5 matching all of them, each 40
    times, and 800 one each): the node went deaf for tens of seconds while it looked 10 million matches
    up and encoded 2 million messages in one turn of its loop. Other clients must still be served (CONNACK
    within 5 s; the whole attack took 20 s of the loop on this machine)."""
    with MeshCluster(1, node_args={"a": ("--mqtt-port", "0")}) as cluster:
        port = cluster.start()["a"].door_port("mqtt")
        filler = await asyncio.to_thread(_connect, port, "filler")
        retained = b"".join(encode(Publish(f"r/{i}", b"x", 0, True), V311) for i in range(10_000))
        await asyncio.to_thread(filler.sendall, retained)
        probe = await asyncio.to_thread(_connect, port, "probe")  # after the retained publishes
        probe.sendall(encode(Subscribe(1, (("r/9999", 0),)), V311))
        seen = b""
        while b"r/9999" not in seen:  # the last retained message is kept: they all are
            seen += await asyncio.to_thread(probe.recv, 4096)
        attacker = await asyncio.to_thread(_connect, port, "attacker")
        stop = threading.Event()
        reader = threading.Thread(target=_read_all, args=(attacker, stop), daemon=True)
        reader.start()
        topics = ["#", "r/#", "+/+", "r/+", "+/#"] * 40 + [f"r/{i}" for i in range(800)]
        filters = tuple((f, 0) for f in topics)
        try:
            attacker.sendall(encode(Subscribe(2, filters), V311))
            await asyncio.sleep(0.5)  # the SUBSCRIBE is being answered
            started = time.monotonic()
            other = await asyncio.to_thread(_connect, port, "bystander")
            assert time.monotonic() - started < 5, "the node stopped serving during one SUBSCRIBE"
            other.close()
        finally:
            stop.set()
            reader.join(timeout=30)
            for sock in (filler, probe, attacker):
                sock.close()


async def test_one_vpn_filling_the_retained_pool_refuses_no_other_vpns_retained_messages(
    tmp_path: Path,
) -> None:
    """A client of team-a sent 10,000 retained PUBLISHes: the node's pool (10,000 topics) was full and
    every other tenant's retained PUBLISH was refused until a restart. Each VPN now has its share (a
    third here: default, team-a, team-b), and no retained message crosses from one VPN to another."""
    vpns = tmp_path / "vpns.toml"
    vpns.write_text("[vpns.team-a]\n[vpns.team-b]\n")
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mesh-vpns", str(vpns), "--mqtt-port", str(port))}) as cluster:
        cluster.start()
        filler = await asyncio.to_thread(_connect, port, "filler", "x@team-a")
        retained = b"".join(encode(Publish(f"r/{i}", b"x", 0, True), V311) for i in range(10_001))
        await asyncio.to_thread(filler.sendall, retained)
        answer: dict[str, object] = {}

        async def refused() -> bool:
            answer.update((await status(cluster["a"]))["mqtt"])
            return bool(answer["counters"].get("retained_refused"))  # type: ignore[attr-defined]

        await eventually(
            refused, timeout=30, interval=0.2, what="team-a's retained PUBLISHes refused past its share"
        )
        other = Paho(port, "b-pub")
        other.client.username_pw_set("y@team-b")
        await connected(other)
        reader = Paho(port, "b-sub")
        reader.client.username_pw_set("z@team-b")
        snoop = Paho(port, "a-sub")
        snoop.client.username_pw_set("w@team-a")
        try:
            info = other.client.publish("r/1", b"team-b's", qos=1, retain=True)
            await asyncio.to_thread(info.wait_for_publish, 10)
            await subscribed(await connected(reader), "r/1", 1)
            await eventually(lambda: reader.payloads() == [b"team-b's"], timeout=10, what="team-b's retained")
            await subscribed(await connected(snoop), "r/1", 1)
            await eventually(lambda: snoop.payloads() == [b"x"], timeout=10, what="team-a's own")
            answer = (await status(cluster["a"]))["mqtt"]
            assert answer["retained_refused"] == {"team-a": 10_001 - 10_000 // 3}
            assert answer["retained"] == 10_000 // 3 + 1
            assert reader.payloads() == [b"team-b's"]
            assert snoop.payloads() == [b"x"]
        finally:
            for client in (other, reader, snoop):
                client.close()
            filler.close()


def _persistent_qos1(port: int, client_id: str, username: str) -> socket.socket | None:
    """A 3.1.1 client with a persistent session and a QoS 1 filter (a queue), connected; None: it got
    no SUBACK (the door closed it)."""
    sock = _connect(port, client_id, username, clean=False)
    sock.sendall(encode(Subscribe(1, ((f"t/{client_id}", 1),)), V311))
    answer = sock.recv(5)
    if not answer:
        sock.close()
        return None
    assert answer == b"\x90\x03\x00\x01\x01"
    return sock


async def test_persistent_sessions_take_their_vpns_share_of_queues_and_expire(tmp_path: Path) -> None:
    """Anonymous 3.1.1 clients with client ids of their own took every one of the node's 1,000 queues
    with persistent sessions, for good (they never expired, and survived restarts): other VPNs' and
    mesh clients' queues were refused. Each VPN now has its share of the sessions' queues (half the
    node's, a third each here), and 3.1.1 sessions expire (``--mqtt-session-expiry``)."""
    vpns = tmp_path / "vpns.toml"
    vpns.write_text("[vpns.team-a]\n[vpns.team-b]\n")
    port = free_port()
    args = ("--mesh-vpns", str(vpns), "--mqtt-port", str(port), "--mqtt-session-expiry", "3")
    with MeshCluster(1, node_args={"a": args}) as cluster:
        cluster.start()
        share = 500 // 3
        clients: list[socket.socket | None] = []
        try:
            for i in range(share):  # connected: their sessions do not expire meanwhile
                clients.append(await asyncio.to_thread(_persistent_qos1, port, f"a{i}", "x@team-a"))
                assert clients[-1] is not None, i
            assert await asyncio.to_thread(_persistent_qos1, port, "one-too-many", "x@team-a") is None
            clients.append(await asyncio.to_thread(_persistent_qos1, port, "b0", "y@team-b"))
            assert clients[-1] is not None  # team-b's share is whole
            answer = (await status(cluster["a"]))["mqtt"]
            assert answer["sessions"] == share + 2  # the refused one's session is kept, without a queue
        finally:
            for sock in clients:
                if sock is not None:
                    sock.sendall(encode(Disconnect(), V311))
                    sock.close()

        async def expired() -> bool:
            answer.update((await status(cluster["a"]))["mqtt"])
            return bool(answer["sessions"] == 0)

        await eventually(expired, timeout=30, interval=0.5, what="the sessions expired")
        assert answer["counters"]["sessions_expired"] == share + 2
        again = await asyncio.to_thread(_persistent_qos1, port, "a-again", "x@team-a")  # their queues went
        assert again is not None
        again.close()


async def test_a_persistent_sessions_filters_are_bounded_in_bytes_and_the_node_serves_on() -> None:
    """1,000 filters of 1 KB in a persistent session: each SUBSCRIBE rewrote (and fsynced) the whole
    sessions file on the node's loop, growing without bound. Past 64 KiB a filter is refused (3.1.1:
    0x80); the SUBACK still comes, and the session is saved (it is there after a reconnect)."""
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mqtt-port", str(port))}) as cluster:
        cluster.start()
        sock = await asyncio.to_thread(_connect, port, "big", None, False)
        filters = tuple((f"{'x' * 1000}/{i}", 1) for i in range(100))
        sock.sendall(encode(Subscribe(7, filters), V311))
        answer = b""
        while len(answer) < 4 + 100:
            answer += await asyncio.to_thread(sock.recv, 4096)
        codes = answer[4:]
        assert answer[:4] == b"\x90\x66\x00\x07"
        taken = codes.count(1)
        assert 55 < taken <= 64  # 64 KiB of filters
        assert codes == b"\x01" * taken + b"\x80" * (100 - taken)
        sock.sendall(encode(Disconnect(), V311))
        sock.close()
        again = await asyncio.to_thread(_connect, port, "big-too", None, False)  # the node serves on
        again.close()
        counters = (await status(cluster["a"]))["mqtt"]["counters"]
        assert counters["session_bytes_limit"] == 100 - taken


def _publish_qos1(sock: socket.socket, packet_id: int, payload: bytes, dup: bool = False) -> None:
    sock.sendall(encode(Publish("q/x", payload, 1, False, dup, packet_id), V311))
    assert sock.recv(4) == bytes([0x40, 2, 0, packet_id])  # its PUBACK


async def _over_two_connections(
    first: list[tuple[int, bytes, bool]], second: list[tuple[int, bytes, bool]]
) -> tuple[list[bytes], dict[str, int]]:
    """A persistent session's QoS 1 PUBLISHes (packet id, payload, DUP), each acknowledged, over one
    connection and then another: what a QoS 1 subscriber got once the last came, and the door's
    counters."""
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mqtt-port", str(port))}) as cluster:
        cluster.start()
        sub = await connected(Paho(port, "sub"))
        await subscribed(sub, "q/#", 1)
        try:
            for sends in (first, second):
                pub = await asyncio.to_thread(_connect, port, "pub", None, False)
                for packet_id, payload, dup in sends:
                    await asyncio.to_thread(_publish_qos1, pub, packet_id, payload, dup)
                pub.close()
            last = second[-1][1]
            await eventually(lambda: last in sub.payloads(), timeout=10, what="the last message")
            counters: dict[str, int] = (await status(cluster["a"]))["mqtt"]["counters"]
            return sub.payloads(), counters
        finally:
            sub.close()


async def test_a_new_qos1_publish_reusing_an_acknowledged_id_and_payload_is_stored_when_resent() -> None:
    """A client with one PUBLISH in flight at a time (packet id 1 each time, as small device clients do)
    sends "on" twice, each acknowledged, then a third "on" (a new event) that its connection loses;
    it sends that one again with DUP after reconnecting to its session. Its PUBACK says stored: the
    event must be there, the third."""
    payloads, _ = await _over_two_connections(
        [(1, b"on", False), (1, b"on", False)],  # the third "on" was lost with this connection
        [(1, b"on", True), (2, b"off", False)],  # its resend: acknowledged, so stored
    )
    assert payloads == [b"on", b"on", b"on", b"off"]


async def test_what_follows_a_persistent_sessions_subscribe_waits_for_its_save_in_order() -> None:
    """The SUBACK waits for the sessions file (written in a worker thread): packets sent behind the
    SUBSCRIBE in the same write are answered after it, in order, and the socket is read again."""
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mqtt-port", str(port))}) as cluster:
        cluster.start()
        sock = await asyncio.to_thread(_connect, port, "pipelined", None, False)
        try:
            burst = encode(Subscribe(1, (("p/1", 1),)), V311) + encode(PingReq(), V311)
            burst += encode(Unsubscribe(2, ("p/1",)), V311) + encode(PingReq(), V311)
            await asyncio.to_thread(sock.sendall, burst)
            expected = b"\x90\x03\x00\x01\x01" + b"\xd0\x00" + b"\xb0\x02\x00\x02" + b"\xd0\x00"
            answer = b""
            while len(answer) < len(expected):
                answer += await asyncio.to_thread(sock.recv, 4096)
            assert answer == expected
            await asyncio.to_thread(sock.sendall, encode(PingReq(), V311))  # read again
            assert await asyncio.to_thread(sock.recv, 2) == b"\xd0\x00"
        finally:
            sock.close()


async def _received(sock: socket.socket, marker: bytes, seen: bytes = b"") -> bytes:
    """What ``sock`` reads until ``marker`` is in it (closed before: a failure)."""
    while marker not in seen:
        chunk = await asyncio.to_thread(sock.recv, 4096)
        assert chunk, f"closed before {marker!r} came"
        seen += chunk
    return seen


def _login(
    port: int, client_id: str, username: str, password: bytes, clean: bool
) -> tuple[socket.socket, bytes]:
    """A 3.1.1 CONNECT as ``username``: the socket and its CONNACK."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(encode(Connect(V311, client_id, clean, username=username, password=password), V311))
    return sock, sock.recv(4)


async def test_another_users_persistent_session_is_neither_resumed_nor_ended_nor_taken_over(
    tmp_path: Path,
) -> None:
    """mallory and alice are users of team-a; alice alone may subscribe to orders. mallory connected
    with alice's client id (not a secret: it is in logs and topics) and a persistent session: the door
    resumed alice's session for him, its subscriptions and the QoS 1 orders stored for alice, which
    mallory's own permissions refuse; with a clean session it ended alice's session, her stored
    messages with it; and it cut alice's live connection. A session is its user's: another user's
    CONNECT with its client id is refused (not authorized), and alice's session is whole."""
    from meshplane.mesh.vpns import hash_password

    hashed = await asyncio.to_thread(hash_password, "pw")
    vpns = tmp_path / "vpns.toml"
    vpns.write_text(
        f'[vpns.team-a.users.alice]\npassword_hash = "{hashed}"\nsubscribe = {{ allow = ["orders.>"] }}\n'
        f'[vpns.team-a.users.mallory]\npassword_hash = "{hashed}"\nsubscribe = {{ allow = ["public.>"] }}\n'
    )
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mesh-vpns", str(vpns), "--mqtt-port", str(port))}) as cluster:
        cluster.start()
        alice, answer = await asyncio.to_thread(_login, port, "alice-phone", "alice@team-a", b"pw", False)
        assert answer == CONNACK_OK
        alice.sendall(encode(Subscribe(1, (("orders/+", 1),)), V311))
        assert await asyncio.to_thread(alice.recv, 5) == b"\x90\x03\x00\x01\x01"
        for clean in (False, True):  # while alice is connected: no takeover
            mallory, answer = await asyncio.to_thread(
                _login, port, "alice-phone", "mallory@team-a", b"pw", clean
            )
            mallory.close()
            assert answer == b"\x20\x02\x00\x05", clean  # not authorized
        alice.sendall(encode(PingReq(), V311))
        assert await asyncio.to_thread(alice.recv, 2) == b"\xd0\x00"  # still connected
        alice.sendall(encode(Disconnect(), V311))
        alice.close()
        publisher, answer = await asyncio.to_thread(_login, port, "pub", "alice@team-a", b"pw", True)
        await asyncio.to_thread(
            publisher.sendall, encode(Publish("orders/eu", b"secret", 1, False, False, 1), V311)
        )
        assert await asyncio.to_thread(publisher.recv, 4) == bytes([0x40, 2, 0, 1])
        publisher.close()
        for clean in (False, True):  # while alice is away: her session is not his
            mallory, answer = await asyncio.to_thread(
                _login, port, "alice-phone", "mallory@team-a", b"pw", clean
            )
            try:
                assert answer == b"\x20\x02\x00\x05", clean
                mallory.settimeout(1.0)
                with contextlib.suppress(TimeoutError, OSError):
                    assert b"secret" not in mallory.recv(4096)
            finally:
                mallory.close()
        alice, answer = await asyncio.to_thread(_login, port, "alice-phone", "alice@team-a", b"pw", False)
        try:
            assert answer == b"\x20\x02\x01\x00"  # her session, present
            await _received(alice, b"secret")
        finally:
            alice.close()
        counters = (await status(cluster["a"]))["mqtt"]["counters"]
        assert counters["session_of_another_user"] == 4


async def test_a_persistent_session_of_a_vpn_gets_its_qos1_messages_connected_and_after_coming_back(
    tmp_path: Path,
) -> None:
    """A persistent session's QoS 1 messages are stored in its queue and sent from there; in a VPN other
    than the default its queue's topic is ``VPN:name``, and the door read ``name``: the messages were
    acknowledged to their publisher, stored, and never sent, connected or not."""
    vpns = tmp_path / "vpns.toml"
    vpns.write_text("[vpns.team-a]\n")
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mesh-vpns", str(vpns), "--mqtt-port", str(port))}) as cluster:
        cluster.start()
        sub = Paho(port, "sub", clean=False)
        sub.client.username_pw_set("x@team-a")
        await subscribed(await connected(sub), "q/+", 1)
        pub = await asyncio.to_thread(_connect, port, "pub", "x@team-a")
        try:
            pub.sendall(encode(Publish("q/1", b"while connected", 1, False, False, 1), V311))
            assert await asyncio.to_thread(pub.recv, 4) == bytes([0x40, 2, 0, 1])
            await eventually(lambda: sub.payloads() == [b"while connected"], timeout=10, what="connected")
            sub.close()
            pub.sendall(encode(Publish("q/2", b"while away", 1, False, False, 2), V311))
            assert await asyncio.to_thread(pub.recv, 4) == bytes([0x40, 2, 0, 2])
        finally:
            pub.close()
        back = Paho(port, "sub", clean=False)
        back.client.username_pw_set("x@team-a")
        await connected(back)
        try:
            await eventually(lambda: b"while away" in back.payloads(), timeout=10, what="after coming back")
        finally:
            back.close()


async def test_a_session_queue_sends_nothing_its_user_may_no_longer_subscribe_to(tmp_path: Path) -> None:
    """alice's persistent session held orders/+ at QoS 1 (its queue stores orders.*); a reload took
    orders from her subscribe permissions while she was away. Her session's filter is refused when she
    comes back, but the queue still stored the orders published meanwhile, and the door sent them all
    to her from there: what she may not subscribe to reached her."""
    from meshplane.mesh.vpns import hash_password

    hashed = await asyncio.to_thread(hash_password, "pw")
    vpns = tmp_path / "vpns.toml"
    users = f'[vpns.team-a.users.alice]\npassword_hash = "{hashed}"\nsubscribe = {{ allow = ["{{}}"] }}\n'
    users += f'[vpns.team-a.users.bob]\npassword_hash = "{hashed}"\n'
    vpns.write_text(users.replace("{}", "orders.>"))
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mesh-vpns", str(vpns), "--mqtt-port", str(port))}) as cluster:
        node = cluster.start()["a"]
        alice, answer = await asyncio.to_thread(_login, port, "alice-phone", "alice@team-a", b"pw", False)
        assert answer == CONNACK_OK
        alice.sendall(encode(Subscribe(1, (("orders/+", 1), ("public/+", 1))), V311))
        assert await asyncio.to_thread(alice.recv, 6) == b"\x90\x04\x00\x01\x01\x80"
        alice.sendall(encode(Disconnect(), V311))
        alice.close()
        vpns.write_text(users.replace("{}", "public.>"))
        node.kill(signal.SIGHUP)

        async def reloaded() -> bool:
            return bool((await status(node))["vpns_reload"].get("reloaded", 0) >= 1)

        await eventually(reloaded, what="the VPN file read again")
        bob, answer = await asyncio.to_thread(_login, port, "bob", "bob@team-a", b"pw", True)
        try:
            for number, (topic, payload) in enumerate(
                (("orders/eu", b"not for alice now"), ("public/x", b"hers")), 1
            ):
                bob.sendall(encode(Publish(topic, payload, 1, False, False, number), V311))
                assert await asyncio.to_thread(bob.recv, 4) == bytes([0x40, 2, 0, number])
        finally:
            bob.close()
        alice, answer = await asyncio.to_thread(_login, port, "alice-phone", "alice@team-a", b"pw", False)
        try:
            assert answer == b"\x20\x02\x01\x00"
            alice.sendall(encode(Subscribe(2, (("public/+", 1),)), V311))  # allowed now
            seen = await _received(alice, b"\x90\x03\x00\x02\x01")
            alice.sendall(encode(Publish("public/x", b"after", 1, False, False, 9), V311))
            seen = await _received(alice, b"after", seen)  # her own, after what the queue held before it
            assert b"not for alice now" not in seen
        finally:
            alice.close()


async def test_a_sessions_subscribe_rewrites_no_queues_file_and_its_queue_comes_back_after_a_sigkill() -> (
    None
):
    """Each SUBSCRIBE and UNSUBSCRIBE of a persistent session's QoS 1 filter changed its queue's
    patterns, and the node rewrote and fsynced its whole queues file (every queue's patterns: with 200
    sessions of 100 filters, 11 MB) on its event loop, about 120 ms each, for any client to repeat. A
    session's queue is saved with the session now (its subscriptions, in the sessions file written off
    the loop): the queues file is not touched, and after a SIGKILL the queue is back, storing what is
    published before its client returns."""
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mqtt-port", str(port))}) as cluster:
        node = cluster.start()["a"]
        queues = node.data_dir / "mesh" / "queues.json"
        sock = await asyncio.to_thread(_connect, port, "keeper", None, False)
        sock.sendall(encode(Subscribe(1, (("k/1", 1),)), V311))
        assert await asyncio.to_thread(sock.recv, 5) == b"\x90\x03\x00\x01\x01"
        before = queues.stat().st_ino if queues.exists() else None
        for number in range(2, 6):  # another QoS 1 filter and back: the queue's patterns change
            sock.sendall(encode(Subscribe(number, (("k/2", 1),)), V311))
            assert await asyncio.to_thread(sock.recv, 5) == bytes([0x90, 3, 0, number, 1])
            sock.sendall(encode(Unsubscribe(number, ("k/2",)), V311))
            assert await asyncio.to_thread(sock.recv, 4) == bytes([0xB0, 2, 0, number])
        assert (queues.stat().st_ino if queues.exists() else None) == before
        sock.close()
        node.kill(signal.SIGKILL)
        node.start()
        pub = await asyncio.to_thread(_connect, port, "pub")
        try:
            pub.sendall(encode(Publish("k/1", b"while away", 1, False, False, 1), V311))
            assert await asyncio.to_thread(pub.recv, 4) == bytes([0x40, 2, 0, 1])
        finally:
            pub.close()
        back = await asyncio.to_thread(_connect, port, "keeper", None, False)
        try:
            await _received(back, b"while away")
        finally:
            back.close()


async def test_a_retained_publish_or_a_vpn_filter_of_the_longest_topic_breaks_no_link(tmp_path: Path) -> None:
    """A retained PUBLISH travels to the other nodes on ``$mqtt.<subject>`` (in a VPN, with its prefix
    too), and a VPN's filter is announced with its prefix: a topic of 1,020 bytes (valid: at most
    1,024) made a subject or pattern past the 1,024 bytes a peer's frame reader takes, which broke the
    node's links, for every tenant. Such a topic or filter is refused at the door."""
    from tests.support.mesh import status

    vpns = tmp_path / "vpns.toml"
    vpns.write_text("[vpns.team-a]\n")
    args = ("--mesh-vpns", str(vpns), "--mqtt-port", "0")
    with MeshCluster(2, extra_args=args) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        ports = {name: cluster[name].door_port("mqtt") for name in "ab"}
        far = Paho(ports["b"], "far")
        far.client.username_pw_set("x@team-a")
        await subscribed(await connected(far), "t/after")
        near = await asyncio.to_thread(_connect, ports["a"], "near", "y@team-a")
        try:

            async def reaches_b() -> bool:
                near.sendall(encode(Publish("t/after", b"warm", 0), V311))
                await asyncio.sleep(0.2)
                return b"warm" in far.payloads()

            await eventually(reaches_b, timeout=30, what="team-a's interest at a")
            before = {link["peer"]: link["connected_secs"] for link in (await status(cluster["a"]))["links"]}
            long = ("x" * 99 + "/") * 10 + "x" * 18  # 1,028 bytes with "$mqtt." and "$vpn:team-a."
            near.sendall(encode(Subscribe(1, ((long + "/#", 0),)), V311))
            assert await asyncio.to_thread(near.recv, 5) == b"\x90\x03\x00\x01\x80"  # refused
            near.sendall(encode(Publish(long, b"retained", 0, True), V311))
            near.settimeout(5)
            with contextlib.suppress(TimeoutError):
                assert near.recv(64) == b""  # 3.1.1: a bad topic closes the connection
            near.close()
            near = await asyncio.to_thread(_connect, ports["a"], "near", "y@team-a")
            near.sendall(encode(Publish("t/after", b"after", 0), V311))
            await eventually(lambda: b"after" in far.payloads(), timeout=30, what="the event after")
            links = (await status(cluster["a"]))["links"]
            assert all(
                link["state"] == "up" and link["connected_secs"] >= before[link["peer"]] for link in links
            )
            assert not (await status(cluster["b"]))["frame_errors"]
        finally:
            near.close()
            far.close()


def _pubacks(sock: socket.socket, count: int) -> list[int]:
    """The packet identifiers of the next ``count`` PUBACKs (fewer: the node closed the connection)."""
    data = b""
    while len(data) < 4 * count:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    assert all(data[i : i + 2] == b"\x40\x02" for i in range(0, len(data) - 3, 4)), data[:16]
    return [int.from_bytes(data[i + 2 : i + 4], "big") for i in range(0, len(data) - 3, 4)]


async def test_a_311_clients_burst_of_qos1_publishes_waits_for_storage_not_a_disconnect() -> None:
    """3.1.1 has no Receive Maximum: a client may send any number of QoS 1 PUBLISHes before their
    PUBACKs. 3,000 in one write (stored in a persistent session's queue) were read in one go past the
    door's 1,024 unanswered, and the client was cut with none acknowledged; the rest of such a read now
    waits for the first ones to be stored, as the socket does."""
    with MeshCluster(1, node_args={"a": ("--mqtt-port", "0")}) as cluster:
        cluster.start()
        port = cluster["a"].door_port("mqtt")
        keeper = await asyncio.to_thread(_connect, port, "keeper", None, False)
        keeper.sendall(encode(Subscribe(1, (("burst/#", 1),)), V311))
        assert keeper.recv(5) == b"\x90\x03\x00\x01\x01"
        keeper.close()
        publisher = await asyncio.to_thread(_connect, port, "burst")
        ids = [i % 0xFFFF + 1 for i in range(3000)]
        burst = b"".join(encode(Publish("burst/x", b"%d" % i, 1, packet_id=i), V311) for i in ids)
        try:
            await asyncio.to_thread(publisher.sendall, burst)
            assert await asyncio.to_thread(_pubacks, publisher, len(ids)) == ids
        finally:
            publisher.close()
        answer = (await status(cluster["a"]))["mqtt"]
        assert not answer["counters"].get("receive_maximum"), answer["counters"]
