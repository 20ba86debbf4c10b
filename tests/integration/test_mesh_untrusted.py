"""The mesh on an untrusted network (issue 34): each finding of the attacker's review, played by raw
peers over TCP (``tests.mesh_peers``) against real nodes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import trustme

from meshplane.core.mesh.frames import FLAG_PROPAGATED, FrameType, encode_frame
from meshplane.errors import TransportError
from meshplane.launchers import MeshCluster, StreamsServerProcess, free_port
from meshplane.mesh.client import MeshClient
from meshplane.mesh.config import SECRET_ENV
from tests.helpers import eventually
from tests.mesh_peers import RawPeer
from tests.support.cli import run_cli
from tests.support.mesh import Inbox, interest_reached, link, publish_all, put_queue, queue_bodies, status

SECRET = "the-mesh-secret-nobody-else-knows"


def node_process(node_id: str, *args: str, secret: str = "") -> StreamsServerProcess:
    return StreamsServerProcess(
        extra_args=("--node-id", node_id, "--cluster", "c1", "--route-port", "0", *args),
        env={SECRET_ENV: secret} if secret else None,
    )


@pytest.fixture
def locked() -> Iterator[StreamsServerProcess]:
    with node_process("locked", secret=SECRET) as node:
        yield node.start()


@pytest.fixture(scope="module")
def plain() -> Iterator[StreamsServerProcess]:
    """A node with the defaults, shared by the tests that neither stop it nor leave state behind that
    another could see: each sends from its own peer ids and counts what its own attack added."""
    with node_process("n") as node:
        yield node.start()


async def counter(node: StreamsServerProcess, name: str) -> int:
    return int((await status(node))["counters"].get(name, 0))


# 1. The secret is handed out --------------------------------------------------------------------------


async def test_a_refused_handshake_teaches_nothing(locked: StreamsServerProcess) -> None:
    for role in ("route", "client"):
        peer = RawPeer(locked.route_url, "mallory", "c1", role, secret="a-guess")
        with pytest.raises(ConnectionRefusedError, match="secret"):
            await asyncio.to_thread(peer.authenticate)
        peer.close()
        assert SECRET.encode() not in peer.received
    assert (await status(locked))["links"] == []
    assert (await status(locked))["frame_errors"]["hello_auth"] == 2
    assert SECRET not in locked.log_path.read_text()


async def test_an_overheard_handshake_cannot_be_replayed(locked: StreamsServerProcess) -> None:
    honest = await asyncio.to_thread(RawPeer(locked.route_url, "c", "", "client", secret=SECRET).authenticate)
    assert SECRET.encode() not in honest.received + honest.sent_auth
    replay = RawPeer(locked.route_url, "c", "", "client")
    replay.nonce = honest.nonce  # the same HELLO, then the AUTH it was answered with
    await asyncio.to_thread(replay.hello)
    replay.send(honest.sent_auth)
    refusal = await asyncio.to_thread(replay.read_until, FrameType.HELLO, FrameType.AUTH)
    assert refusal.type is FrameType.HELLO  # the node's challenge was another nonce
    assert await asyncio.to_thread(replay.closed)
    honest.close()


async def test_a_client_refuses_a_node_that_cannot_prove_the_secret() -> None:
    with node_process("open") as node:  # no secret: it cannot prove one
        node.start()
        with pytest.raises(TransportError, match="secret"):
            await MeshClient(node.route_url, secret=SECRET, timeout=3).connect()


# 2. An impostor erases acknowledged guaranteed events ------------------------------------------------


async def test_an_impostor_cannot_take_a_down_nodes_spool() -> None:
    with MeshCluster(2, env={SECRET_ENV: SECRET}).start() as pair:
        await asyncio.to_thread(pair.wait_linked)
        await put_queue(pair["b"], "orders", ["orders.>"])
        await interest_reached(pair["a"], "b", "$G.orders.>")
        pair["b"].kill(signal.SIGKILL)
        await eventually(lambda: link_state(pair["a"], "b", "down"), timeout=15, what="a sees b down")
        publisher = await MeshClient(pair["a"].route_url, secret=SECRET).connect()
        bodies = [b"%d" % i for i in range(100)]
        await publish_all(publisher, "orders.eu", bodies)
        impostor = RawPeer(pair["a"].route_url, "b", "c1", secret="stolen?")
        with pytest.raises(ConnectionRefusedError, match="secret"):
            await asyncio.to_thread(impostor.authenticate)
        impostor.close()
        assert [s["pending"] for s in (await status(pair["a"]))["guaranteed"]["spools"]] == [100]
        pair["b"].start()

        async def delivered() -> bool:
            return await queue_bodies(pair["b"], "orders") == bodies

        await eventually(delivered, timeout=30, what="every acknowledged event in b's queue")
        await publisher.close()


async def link_state(node: StreamsServerProcess, peer: str, state: str) -> bool:
    return bool((await link(node, peer))["state"] == state)


# 3. One frame stops guaranteed delivery to a live node --------------------------------------------------


async def test_a_second_connection_claiming_a_live_node_changes_nothing() -> None:
    with MeshCluster(2).start() as pair:
        await asyncio.to_thread(pair.wait_linked)
        await put_queue(pair["a"], "q", ["g.>"])
        await interest_reached(pair["b"], "a", "$G.g.>")
        # Another process (another epoch) claiming a: refused while a's link lives.
        other = RawPeer(pair["b"].route_url, "a", "c1", epoch=12345)
        with pytest.raises(ConnectionRefusedError, match="live link"):
            await asyncio.to_thread(other.authenticate)
        other.close()
        # The same process (its epoch, as GET /mesh shows it) dials twice only as a link starts: later,
        # a second connection is a claim, refused too; what it sends is never applied.
        epoch = (await status(pair["a"]))["epoch"]
        await eventually(lambda: link_older_than(pair["b"], "a", 5.5), timeout=15, what="a settled link")
        twin = RawPeer(pair["b"].route_url, "a", "c1", epoch=epoch)
        with pytest.raises(ConnectionRefusedError, match="live link"):
            await asyncio.to_thread(twin.authenticate)
        twin.send(encode_frame(FrameType.SUB_REMOVE, "a", "$G.g.>", 2**62))
        assert await asyncio.to_thread(twin.closed)
        publisher = await MeshClient(pair["b"].route_url).connect()
        bodies = [b"%d" % i for i in range(50)]
        await publish_all(publisher, "g.x", bodies)

        async def delivered() -> bool:
            return await queue_bodies(pair["a"], "q") == bodies

        await eventually(delivered, timeout=20, what="every guaranteed event in a's queue")
        assert (await link(pair["b"], "a"))["state"] == "up"
        assert (await status(pair["b"]))["frame_errors"]["hello_duplicate"] >= 2
        await publisher.close()


async def link_older_than(node: StreamsServerProcess, peer: str, seconds: float) -> bool:
    """Whether the link's connection has lived longer than the window in which both ends may dial."""
    return bool((await link(node, peer))["connected_secs"] > seconds)


async def test_an_interest_version_beyond_what_the_peer_can_have_made_closes_its_link(
    plain: StreamsServerProcess,
) -> None:
    before = await counter(plain, "closed_version_jump")
    peer = await asyncio.to_thread(RawPeer(plain.route_url, "x", "c1", epoch=time.time_ns()).authenticate)
    peer.send(encode_frame(FrameType.SUB_REMOVE, "x", "$G.g.>", 2**62))
    assert await asyncio.to_thread(peer.closed)
    assert await counter(plain, "closed_version_jump") == before + 1


# 4. A peer grows a node's memory ---------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_sync_requests_never_read_close_that_connection_only() -> None:
    with node_process("n", "--mesh-max-pending-bytes", "2000000") as node:
        node.start()
        client = await MeshClient(node.route_url).connect()
        for i in range(2000):
            client.subscribe(f"p{i}.*.x", Inbox())
        await client.flush()
        peer = await asyncio.to_thread(RawPeer(node.route_url, "x", "c1").authenticate)
        peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

        def flood() -> bool:
            try:
                for _ in range(20_000):
                    peer.send(encode_frame(FrameType.SYNC_REQ, "x", payload=os.urandom(512)))
            except OSError:
                return True  # the node closed it
            return False

        assert await asyncio.to_thread(flood)
        assert await counter(node, "closed_slow_peer") == 1
        assert node.proc is not None
        assert rss_mb(node.proc.pid) < 300
        await client.flush()  # everybody else is served
        await client.close()


@pytest.mark.timeout(240)  # its waits add up to 220 s
async def test_route_and_pattern_limits_close_or_refuse_with_a_reason() -> None:
    # Short heartbeats: a peer's EOF alone does not end its link (it may be retiring that connection);
    # the next heartbeat finds it gone (up to 1 s at the default, paid 21 times below). What is
    # remembered of a link does not depend on the interval.
    args = ("--mesh-max-routes", "3", "--mesh-max-patterns-per-peer", "100", "--heartbeat-interval", "0.2")
    with node_process("n", *args) as node:
        node.start()
        for i in range(50):  # HELLOs that never prove anything: nothing remembered
            await asyncio.to_thread(RawPeer(node.route_url, f"h{i}", "c1").hello)
        assert (await status(node))["links"] == []
        peers = []
        for i in range(3):
            peers.append(await asyncio.to_thread(RawPeer(node.route_url, f"r{i}", "c1").authenticate))
        with pytest.raises(ConnectionRefusedError, match="limit"):
            await asyncio.to_thread(RawPeer(node.route_url, "r3", "c1").authenticate)
        assert len((await status(node))["links"]) == 3
        greedy = peers[0]
        greedy.send(*(encode_frame(FrameType.SUB_ADD, "r0", f"s.{i}", i + 1) for i in range(101)))
        assert await asyncio.to_thread(greedy.closed)
        assert await counter(node, "closed_pattern_limit") == 1
        for peer in peers:
            peer.close()
        # Links that never carried anything are not remembered: ids churned through cost nothing.
        await eventually(lambda: no_links(node), what="the links that never came up forgotten")
        for i in range(20):  # more ids than the limit, one after the other
            churn = await asyncio.to_thread(RawPeer(node.route_url, f"churn{i}", "c1").authenticate)
            churn.close()
            await eventually(lambda: no_links(node), what="a churned link forgotten")


async def no_links(node: StreamsServerProcess) -> bool:
    return not (await status(node))["links"]


async def test_many_half_frames_together_are_bounded_by_one_budget() -> None:
    with node_process("n", "--mesh-max-partial-bytes", "16000000") as node:
        node.start()
        assert node.proc is not None
        before = rss_mb(node.proc.pid)
        frame = encode_frame(FrameType.EVENT, "", "a.b", 1, b"x" * 7_000_000)
        peers = []
        for i in range(30):
            peers.append(await asyncio.to_thread(RawPeer(node.route_url, f"p{i}", "", "client").authenticate))
        for peer in peers:
            with contextlib.suppress(OSError):  # closed already
                await asyncio.to_thread(peer.send, frame[:6_000_000])
        await eventually(
            lambda: counter_at_least(node, "closed_partial_bytes", 25), what="half frames closed"
        )
        partial = (await status(node))["partial_bytes"]
        assert partial["peak"] <= 16_000_000 + 30 * 2 * 256 * 1024  # 30 x 6 MB would be 180 MB held
        assert rss_mb(node.proc.pid) - before < 150  # the allocator keeps some of what was freed
        client = await MeshClient(node.route_url).connect()
        await client.flush()  # everyone else is served
        await client.close()
        for peer in peers:
            peer.close()


async def counter_at_least(node: StreamsServerProcess, name: str, count: int) -> bool:
    return await counter(node, name) >= count


async def test_pings_a_peer_never_answers_expire_and_are_bounded_per_client() -> None:
    args = ("--heartbeat-interval", "5", "--mesh-ping-timeout", "1", "--mesh-max-pings-per-client", "50")
    with node_process("n", *args) as node:
        node.start()
        silent = await asyncio.to_thread(RawPeer(node.route_url, "silent", "c1").authenticate)
        client = await MeshClient(node.route_url, timeout=10).connect()
        started = time.monotonic()
        await client.flush(propagated=True)  # the silent peer never answers: expired after 1 s
        assert time.monotonic() - started < 8
        assert await counter(node, "pings_expired") >= 1
        flooder = await asyncio.to_thread(RawPeer(node.route_url, "f", "", "client").authenticate)
        flooder.send(*(encode_frame(FrameType.SYNC_REQ, "", flags=FLAG_PROPAGATED) for _ in range(51)))
        assert await asyncio.to_thread(flooder.closed)
        assert await counter(node, "closed_ping_limit") == 1
        await client.flush()
        await client.close()
        silent.close()


async def test_half_frames_and_silent_connections_are_closed() -> None:
    with node_process("n", "--mesh-frame-timeout", "1", "--mesh-idle-timeout", "2") as node:
        node.start()
        client = await MeshClient(node.route_url).connect()  # it answers heartbeats: it stays
        half = await asyncio.to_thread(RawPeer(node.route_url, "h", "", "client").authenticate)
        half.send(encode_frame(FrameType.EVENT, "", "a.b", 1, b"x" * 100_000)[:50_000])
        mute = await asyncio.to_thread(RawPeer(node.route_url, "m", "", "client").authenticate)
        assert await asyncio.to_thread(half.closed)
        assert await asyncio.to_thread(mute.closed)  # connected after the client, idle for 2 s
        assert await counter(node, "closed_slow_frame") == 1
        assert await counter(node, "closed_idle") == 1
        assert client.connected
        await client.flush()
        await client.close()


# 6. Phantoms block guaranteed publishing; 7. a storage error becomes a reconnect storm -----------------


async def test_a_long_peer_id_is_refused_at_hello(plain: StreamsServerProcess) -> None:
    before = (await status(plain))["frame_errors"].get("hello_malformed", 0)
    answer = await asyncio.to_thread(RawPeer(plain.route_url, "g" * 200, "c1").hello)
    assert "HELLO's node: at most 64" in answer.error
    answer = await asyncio.to_thread(RawPeer(plain.route_url, "g" * 20, "c1").hello)
    assert "node id 'gggggggggggggggggggg': 1-16" in answer.error
    assert (await status(plain))["frame_errors"]["hello_malformed"] == before + 2


async def test_a_failed_store_is_an_error_ack_and_the_client_stays() -> None:
    with node_process("n") as node:
        node.start()
        ghost = await asyncio.to_thread(RawPeer(node.route_url, "ghost", "c1").authenticate)
        ghost.send(encode_frame(FrameType.SUB_ADD, "ghost", "$G.>", 1))
        client = await MeshClient(node.route_url).connect()
        await eventually(lambda: ghost_known(node), what="ghost's queue interest")
        spool = node.data_dir / "mesh" / "spool" / b"ghost".hex()
        spool.parent.mkdir(parents=True, exist_ok=True)
        spool.write_bytes(b"not a directory")  # the spool cannot be made
        for _ in range(3):
            with pytest.raises(TransportError, match="did not store"):
                await client.publish("any.thing", b"x", guaranteed=True)
        assert client.connected
        assert len((await status(node))["clients"]) == 1  # no reconnect storm
        await client.close()
        ghost.close()


async def ghost_known(node: StreamsServerProcess) -> bool:
    return "$G.>" in (await status(node, patterns=True))["patterns"]["peers"].get("ghost", [])


# 8. The rest ------------------------------------------------------------------------------------------


async def test_a_node_that_closes_during_the_handshake_sends_the_client_to_the_next_at_once(
    plain: StreamsServerProcess,
) -> None:
    listener = socket.create_server(("127.0.0.1", free_port()))
    closing = asyncio.get_running_loop().run_in_executor(None, lambda: listener.accept()[0].close())
    url = f"tcp://127.0.0.1:{listener.getsockname()[1]},{plain.route_url}"
    started = time.monotonic()
    client = await MeshClient(url, timeout=30).connect()
    assert time.monotonic() - started < 5
    assert client.node == "n"
    await client.close()
    await closing
    listener.close()


def written_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


async def test_a_departed_node_is_forgotten_and_queue_changes_cost_their_size() -> None:
    with node_process("n", "--spool-max-events", "5") as node:
        node.start()
        assert node.proc is not None
        ghost = await asyncio.to_thread(RawPeer(node.route_url, "ghost", "c1").authenticate)
        before = written_bytes(node.proc.pid)
        ghost.send(*(encode_frame(FrameType.SUB_ADD, "ghost", f"$G.q{i}.>", i + 1) for i in range(3000)))
        ghost.send(encode_frame(FrameType.SUB_ADD, "ghost", "$G.>", 3001))
        await eventually(lambda: ghost_known(node), what="ghost's queue interest")
        assert written_bytes(node.proc.pid) - before < 5_000_000  # not 3,000 rewrites of the whole file
        ghost.close()
        await eventually(lambda: no_links(node), what="ghost gone (its link never came up: forgotten)")
        client = await MeshClient(node.route_url).connect()
        await publish_all(client, "any.thing", [b"%d" % i for i in range(5)])
        with pytest.raises(TransportError, match="full"):
            await client.publish("any.thing", b"6", guaranteed=True)
        node.stop()
        node.start()  # what a node remembers of ghost survives a restart ...
        client = await MeshClient(node.route_url).connect()
        with pytest.raises(TransportError, match="full"):
            await client.publish("any.thing", b"6", guaranteed=True)
        forget = await asyncio.to_thread(run_cli, "mesh", "forget", "ghost", "--url", node.url)
        assert forget.returncode == 0, forget.stdout + forget.stderr
        assert json.loads(forget.stdout)["spooled_events_dropped"] == 5
        await client.publish("any.thing", b"7", guaranteed=True)  # ... until it is forgotten
        mesh = await status(node)
        assert mesh["guaranteed"]["spools"] == []
        assert [entry["peer"] for entry in mesh["links"]] == []
        assert mesh["counters"]["nodes_forgotten"] == 1
        node.stop()
        node.start()
        assert (await status(node))["guaranteed"]["spools"] == []
        await client.close()


# 9. Links in clear text: TLS 1.3 with certificates that name the node ------------------------------------


@pytest.fixture(scope="module")
def mesh_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA; certificates for nodes a and b (their ids, and 127.0.0.1 for clients), for a client and
    for mallory, whose certificate the CA signed but names neither node."""
    folder = tmp_path_factory.mktemp("mesh-pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    for name, identities in {
        "a": ("a", "127.0.0.1"),
        "b": ("b", "127.0.0.1"),
        "c": ("c", "127.0.0.1"),
        "client": ("client",),
        "mallory": ("mallory",),
        "x": ("x",),
        "gA": ("gA", "A", "127.0.0.1"),  # a gateway: its node id and its cluster
        "gB": ("gB", "B", "127.0.0.1"),
    }.items():
        cert = ca.issue_cert(*identities)
        cert.private_key_pem.write_to_path(str(folder / f"{name}.key"))
        cert.cert_chain_pems[0].write_to_path(str(folder / f"{name}.pem"))
    return folder


def tls_args(pki: Path, name: str) -> tuple[str, ...]:
    return (
        *("--mesh-tls-cert", str(pki / f"{name}.pem"), "--mesh-tls-key", str(pki / f"{name}.key")),
        *("--mesh-tls-ca", str(pki / "ca.pem")),
    )


def client_tls(pki: Path, name: str = "client") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki / "ca.pem")
    context.load_cert_chain(pki / f"{name}.pem", pki / f"{name}.key")
    return context


async def test_links_and_clients_over_tls_with_identities_from_certificates(mesh_pki: Path) -> None:
    node_args = {node: tls_args(mesh_pki, node) for node in ("a", "b")}
    with MeshCluster(2, node_args=node_args, env={SECRET_ENV: SECRET}).start() as pair:
        await asyncio.to_thread(pair.wait_linked)
        tls = client_tls(mesh_pki)
        subscriber = await MeshClient(pair["b"].route_url, secret=SECRET, tls=tls).connect()
        inbox = Inbox()
        subscriber.subscribe("tls.>", inbox)
        await subscriber.flush(propagated=True)
        publisher = await MeshClient(pair["a"].route_url, secret=SECRET, tls=tls).connect()
        for i in range(100):
            await publisher.publish("tls.x", b"%d" % i)
        await eventually(lambda: len(inbox.events) == 100, what="100 events over TLS")
        assert inbox.events == [("tls.x", b"%d" % i) for i in range(100)]
        # A certificate the CA signed, the secret too, but a claim the certificate does not carry.
        mallory = RawPeer(pair["a"].route_url, "b", "c1", secret=SECRET, tls=client_tls(mesh_pki, "mallory"))
        answer = await asyncio.to_thread(mallory.hello)
        assert "certificate does not name 'meshplane://node/c1/b'" in answer.error
        mallory.close()
        assert (await status(pair["a"]))["frame_errors"]["hello_identity"] == 1
        with pytest.raises(TransportError):  # no client certificate: no TLS session at all
            await MeshClient(
                pair["a"].route_url,
                secret=SECRET,
                timeout=2,
                tls=ssl.create_default_context(cafile=mesh_pki / "ca.pem"),
            ).connect()
        assert (await link(pair["a"], "b"))["state"] == "up"
        await publisher.close()
        await subscriber.close()


async def test_listings_follow_the_tokens_prefixes_on_every_route(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("admin-0123456789abcdef\norders-reader-0123456789  read:orders.\n")
    with node_process("n", "--token-file", str(tokens)) as node:
        node.start()
        admin = {"Authorization": "Bearer admin-0123456789abcdef"}
        reader = {"Authorization": "Bearer orders-reader-0123456789"}
        async with aiohttp.ClientSession(node.url) as http:
            for name in ("orders.eu", "payments.eu"):
                async with http.post(f"/topics/{name}", json={"num_partitions": 1}, headers=admin) as r:
                    assert r.status in (200, 201)
                async with http.post(
                    f"/topics/{name}/publish", json={"event_type": "e", "data": 1}, headers=admin
                ) as r:
                    assert r.status == 200
                async with http.put(f"/mesh/queues/{name}q", json={"patterns": [name]}, headers=admin) as r:
                    assert r.status == 200
            for headers, expected in ((admin, {"orders.eu", "payments.eu"}), (reader, {"orders.eu"})):
                async with http.get("/topics", headers=headers) as r:
                    assert set((await r.json())["topics"]) >= expected
                    assert ("payments.eu" in (await r.json())["topics"]) == (headers is admin)
                async with http.get("/metrics", headers=headers) as r:
                    metrics = await r.text()
                    assert 'topic="orders.eu"' in metrics
                    assert ('topic="payments.eu"' in metrics) == (headers is admin)
                for path in ("/mesh", "/mesh/queues"):
                    async with http.get(path, headers=headers) as r:
                        text = await r.text()
                        assert "orders.euq" in text
                        assert ("payments.euq" in text) == (headers is admin)


async def test_gateways_over_tls_carry_events_and_refuse_a_cluster_their_certificate_lacks(
    mesh_pki: Path,
) -> None:
    ports = {"gA": free_port(), "gB": free_port()}
    peers = {"gA": ("B", "gB"), "gB": ("A", "gA")}
    nodes = {
        name: node_process(
            name,
            *("--cluster", name[1], "--route-port", str(port), "--heartbeat-interval", "0.2"),
            *("--gateway", f"{peers[name][0]}=tcp://127.0.0.1:{ports[peers[name][1]]}"),
            *tls_args(mesh_pki, name),
            secret=SECRET,
        )
        for name, port in ports.items()
    }
    with nodes["gA"] as a, nodes["gB"] as b:
        a.start()
        b.start()
        tls = client_tls(mesh_pki)
        subscriber = await MeshClient(b.route_url, secret=SECRET, tls=tls).connect()
        inbox = Inbox()
        subscriber.subscribe("far.>", inbox)
        await subscriber.flush(propagated=True)
        publisher = await MeshClient(a.route_url, secret=SECRET, tls=tls).connect()

        async def crossed() -> bool:
            await publisher.publish("far.x", b"over TLS")
            await publisher.flush()
            return bool(inbox.events)

        await eventually(crossed, timeout=20, what="an event across the TLS gateway link")
        # A certificate for node x (not for cluster B) claiming to be cluster B's gateway.
        impostor = RawPeer(a.route_url, "x", "B", "gateway", secret=SECRET, tls=client_tls(mesh_pki, "x"))
        answer = await asyncio.to_thread(impostor.hello)
        impostor.close()
        assert "certificate does not name 'meshplane://node/B/x'" in answer.error
        await publisher.close()
        await subscriber.close()


# Done when: every finding at once, against a three-node TLS cluster under guaranteed publishers ----------


async def attack(route_url: str, pki: Path, stop: asyncio.Event) -> dict[str, int]:
    """Every attack above, over and over, until ``stop``: what each achieved."""
    tally = {"refused": 0, "closed": 0}
    member = client_tls(pki, "x")  # a certificate the CA signed for an id no node has
    outsider = client_tls(pki, "mallory")

    def once(round_: int) -> None:
        for peer, expect in (
            (RawPeer(route_url, "c", "c1", secret="guess", tls=member), "refused"),  # wrong secret
            (RawPeer(route_url, "c", "c1", secret=SECRET, tls=outsider), "refused"),  # wrong identity
            (RawPeer(route_url, f"h{round_}", "c1", secret=SECRET, tls=member), "refused"),  # id not in cert
        ):
            try:
                peer.authenticate()
            except (ConnectionRefusedError, ConnectionError):
                tally[expect] += 1
            peer.close()
        rogue = RawPeer(route_url, "x", "c1", secret=SECRET, tls=member).authenticate()
        try:  # an authenticated member gone bad: SUB_ADD and SYNC_REQ floods, then a half frame
            rogue.send(*(encode_frame(FrameType.SUB_ADD, "x", f"r{round_}.{i}", i + 1) for i in range(500)))
            for _ in range(400):
                rogue.send(encode_frame(FrameType.SYNC_REQ, "x", payload=os.urandom(512)))
            rogue.send(encode_frame(FrameType.SUB_REMOVE, "x", "$G.orders.>", 2**62))
        except OSError:
            pass
        if rogue.closed(timeout=15):
            tally["closed"] += 1
        rogue.close()
        for i in range(20):  # HELLOs under ever new ids that never prove anything
            RawPeer(route_url, f"n{round_}-{i}", "c1", tls=member).close()
        client = RawPeer(route_url, "c", "", "client", secret=SECRET, tls=member).authenticate()
        try:  # a client: propagated pings past its limit, then half a frame
            client.send(*(encode_frame(FrameType.SYNC_REQ, "", flags=FLAG_PROPAGATED) for _ in range(1100)))
            client.send(encode_frame(FrameType.EVENT, "", "a.b", 1, b"x" * 100_000)[:50_000])
        except OSError:
            pass
        if client.closed(timeout=15):
            tally["closed"] += 1
        client.close()

    round_ = 0
    while not stop.is_set():
        await asyncio.to_thread(once, round_)
        round_ += 1
    return tally


async def health_latencies(nodes: list[StreamsServerProcess], stop: asyncio.Event) -> list[float]:
    latencies: list[float] = []
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            for node in nodes:
                started = time.perf_counter()
                async with http.get(f"{node.url}/health") as response:
                    assert response.status == 200
                latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)
    return latencies


async def test_a_tls_cluster_under_every_attack_loses_nothing_and_stays_responsive(mesh_pki: Path) -> None:
    limits = ("--mesh-max-pending-bytes", "1000000", "--mesh-max-patterns-per-peer", "300")
    node_args = {node: (*tls_args(mesh_pki, node), *limits) for node in ("a", "b", "c")}
    with MeshCluster(3, node_args=node_args, env={SECRET_ENV: SECRET}).start() as cluster:
        await asyncio.to_thread(cluster.wait_linked)
        admin = cluster["c"]
        await put_queue(admin, "orders", ["orders.>"])
        for node in ("a", "b"):
            await interest_reached(cluster[node], "c", "$G.orders.>")
        stop = asyncio.Event()
        attacks = [asyncio.create_task(attack(cluster[n].route_url, mesh_pki, stop)) for n in ("a", "b", "c")]
        health = asyncio.create_task(health_latencies(cluster.nodes, stop))
        acknowledged: list[bytes] = []

        async def publish_from(node: str) -> None:
            client = await MeshClient(
                cluster[node].route_url, secret=SECRET, tls=client_tls(mesh_pki)
            ).connect()
            for i in range(1500):
                body = b"%s-%d" % (node.encode(), i)
                await client.publish("orders.eu", body, guaranteed=True)
                acknowledged.append(body)
            await client.close()

        await asyncio.gather(publish_from("a"), publish_from("b"))
        stop.set()
        tallies = await asyncio.gather(*attacks)
        latencies = sorted(await health)

        async def all_stored() -> bool:
            return len(await queue_bodies(admin, "orders")) >= len(acknowledged)

        await eventually(all_stored, timeout=60, what="every acknowledged event in the queue")
        stored = await queue_bodies(admin, "orders")
        assert sorted(stored) == sorted(acknowledged)  # none lost, none doubled
        for node in ("a", "b"):  # in publisher order
            mine = [body for body in stored if body.startswith(node.encode())]
            assert mine == [b"%s-%d" % (node.encode(), i) for i in range(1500)]
        assert all(tally["refused"] > 0 and tally["closed"] > 0 for tally in tallies), tallies
        # A node the attacks froze answers in seconds; a loaded machine's scheduler alone takes 0.25 s.
        assert latencies[int(len(latencies) * 0.99)] < 0.5
        for process in cluster.nodes:
            assert process.proc is not None
            assert rss_mb(process.proc.pid) < 300
        links = (await status(admin))["links"]
        states = {entry["peer"]: entry["state"] for entry in links if entry["peer"] in ("a", "b")}
        assert states == {"a": "up", "b": "up"}
