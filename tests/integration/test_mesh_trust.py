"""Nothing a peer says before its proof is believed, and nothing it sends before it can make a node
hold much (issue 54): a refusal only logged, a HELLO bounded, a flood of connections capped."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.core.mesh.frames import (
    FLAG_GUARANTEED,
    PROTOCOL_VERSION,
    FrameType,
    Hello,
    encode_event,
    encode_frame,
    encode_payload,
)
from meshplane.launchers import StreamsServerProcess, free_port
from meshplane.mesh.client import MeshClient
from meshplane.mesh.config import CLIENT_SECRET_ENV, MEMBER_SECRET_ENV, SECRET_ENV
from tests.helpers import eventually
from tests.mesh_peers import RawPeer
from tests.mesh_pki import MeshCA
from tests.support.mesh import Inbox, status

SECRET = "the-mesh-secret-nobody-else-knows"


def node_process(node_id: str, *args: str) -> StreamsServerProcess:
    return StreamsServerProcess(
        extra_args=("--node-id", node_id, "--cluster", "c1", "--route-port", "0", *args),
        env={SECRET_ENV: SECRET},
    )


@pytest.fixture(scope="module")
def node_n() -> Iterator[StreamsServerProcess]:
    """Node n with the defaults, shared by tests that neither stop it nor reconfigure it: each counts
    what its own attack added, from peers of its own."""
    with node_process("n") as node:
        yield node.start()


@pytest.fixture(scope="module")
def node_b() -> Iterator[StreamsServerProcess]:
    """Node b, shared likewise."""
    with node_process("b") as node:
        yield node.start()


def poison(listener: socket.socket, error: str, times: int) -> int:
    """Answer the HELLO of each node dialling ``listener`` with a refusal; the dials seen in 20 s."""
    dials = 0
    listener.settimeout(20)
    for _ in range(times):
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            break
        dials += 1
        peer = RawPeer("", "a")
        peer.sock = sock
        sock.settimeout(10)
        peer.read_until(FrameType.HELLO)
        answer = Hello(PROTOCOL_VERSION, "a", "c1", "route", 1, b"", error)
        peer.send(encode_frame(FrameType.HELLO, "a", payload=encode_payload(answer)))
        sock.close()
    return dials


async def test_a_self_refusal_before_any_proof_leaves_the_dial_retrying() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    with node_process("b", "--routes", url) as node:
        node.start()
        dials = await asyncio.to_thread(poison, listener, "self: a route to this node itself", 3)
        assert dials == 3  # before issue 54: 1, and the address was never dialled again
        assert (await status(node))["frame_errors"]["refused_by_peer"] >= 2
    listener.close()


def rss_mb(node: StreamsServerProcess) -> float:
    assert node.proc is not None
    for line in Path(f"/proc/{node.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def send_quietly(route_url: str, data: bytes) -> bytes:
    """Connect, send ``data`` (as far as the node reads it) and return what the node answered."""
    host, port = route_url[len("tcp://") :].split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            sock.sendall(data)
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass  # closed by the node while sending: what the test expects
    return answer


def hello_frame(node_id: str, role: str = "route") -> bytes:
    hello = Hello(PROTOCOL_VERSION, node_id, "c1", role, 1, b"n" * 32)  # type: ignore[arg-type]
    return encode_frame(FrameType.HELLO, "", payload=encode_payload(hello))


async def test_an_8_mib_hello_is_cut_off_at_its_header_and_memory_and_log_stay_bounded(
    node_n: StreamsServerProcess,
) -> None:
    node = node_n
    before, log_before = rss_mb(node), node.log_path.stat().st_size
    closed_before = (await status(node))["counters"].get("closed_hello_too_large", 0)
    frame = hello_frame("x" * (8 << 20), "client")
    for _ in range(5):  # 150 connections, 30 at once (under the per-address cap)
        await asyncio.gather(*(asyncio.to_thread(send_quietly, node.route_url, frame) for _ in range(30)))
    counters = (await status(node))["counters"]
    assert counters["closed_hello_too_large"] == closed_before + 150
    assert rss_mb(node) - before < 40  # before issue 54: 150 x 8 MiB held until the deadline
    assert node.log_path.stat().st_size - log_before < 16_000  # a line a second at most
    client = await MeshClient(node.route_url, secret=SECRET).connect()
    await client.flush()  # everyone else is served
    await client.close()


async def test_a_flood_of_long_invalid_ids_echoes_and_logs_a_bounded_text(
    node_n: StreamsServerProcess,
) -> None:
    node = node_n
    log_before = node.log_path.stat().st_size
    malformed_before = (await status(node))["frame_errors"].get("hello_malformed", 0)
    frame = hello_frame("\u212a" * 1000)  # non-ASCII (a Kelvin sign), and far longer than an id
    answers = []
    for _ in range(10):
        answers += await asyncio.gather(
            *(asyncio.to_thread(send_quietly, node.route_url, frame) for _ in range(20))
        )
    assert all(0 < len(answer) < 600 for answer in answers)  # the refusal, without the id
    assert (await status(node))["frame_errors"]["hello_malformed"] == malformed_before + 200
    assert node.log_path.stat().st_size - log_before < 16_000  # before issue 54: 200 x the id


async def test_connections_that_never_prove_anything_are_capped_and_timed_out() -> None:
    args = ("--mesh-max-unauthenticated-per-address", "20")
    with node_process("n", *args) as node:
        node.start()
        host, port = node.route_url[len("tcp://") :].split(":")
        silent = [socket.create_connection((host, int(port))) for _ in range(100)]
        await eventually(
            lambda: counter_at_least(node, "closed_address_limit", 80), what="80 connections refused at once"
        )
        await eventually(
            lambda: frame_errors_at_least(node, "handshake_timeout", 20), what="the other 20 timed out"
        )
        client = await MeshClient(node.route_url, secret=SECRET).connect()  # room again
        await client.flush()
        await client.close()
        for sock in silent:
            sock.close()


async def counter_at_least(node: StreamsServerProcess, name: str, count: int) -> bool:
    return int((await status(node))["counters"].get(name, 0)) >= count


async def frame_errors_at_least(node: StreamsServerProcess, name: str, count: int) -> bool:
    return int((await status(node))["frame_errors"].get(name, 0)) >= count


async def test_a_member_stamping_another_nodes_origin_hides_none_of_its_events(
    node_b: StreamsServerProcess,
) -> None:
    node = node_b
    subscriber = await MeshClient(node.route_url, secret=SECRET).connect()
    inbox = Inbox()
    subscriber.subscribe("orders.>", inbox)
    await subscriber.flush()
    forger = await asyncio.to_thread(RawPeer(node.route_url, "x", "c1", secret=SECRET).authenticate)
    real = await asyncio.to_thread(RawPeer(node.route_url, "y", "c1", secret=SECRET).authenticate)
    forger.send(*(encode_event("y", "orders.eu", n, 1000, b"forged") for n in range(1, 11)))
    await eventually(lambda: len(inbox.events) == 10, what="the forged events")
    real.send(*(encode_event("y", "orders.eu", n, 1000, b"real") for n in range(1, 11)))
    await eventually(  # before issue 54: every real event taken for a duplicate of a forged one
        lambda: inbox.events.count(("orders.eu", b"real")) == 10, what="y's own events"
    )
    forger.close()
    real.close()
    await subscriber.close()


async def test_a_clients_guaranteed_event_must_carry_the_origin_the_node_gave_it(
    node_b: StreamsServerProcess,
) -> None:
    node = node_b
    before = (await status(node))["frame_errors"].get("foreign_origin", 0)
    client = await asyncio.to_thread(RawPeer(node.route_url, "app", "", "client", secret=SECRET).authenticate)
    for source, sequence in (("b", 1), (client.origin, 2)):
        client.send(encode_event(source, "orders.eu", sequence, 1000, b"x", FLAG_GUARANTEED))
        ack = await asyncio.to_thread(client.read_until, FrameType.ACK)
        assert ack.sequence == sequence
        assert (b"origin" in ack.payload) == (source != client.origin)
    assert (await status(node))["frame_errors"]["foreign_origin"] == before + 1
    client.close()


MEMBERS, CLIENTS = "the-members-secret-0123456789", "the-clients-secret-0123456789"


def split_secrets_node(node_id: str, *args: str) -> StreamsServerProcess:
    return StreamsServerProcess(
        extra_args=("--node-id", node_id, "--cluster", "c1", "--route-port", "0", *args),
        env={MEMBER_SECRET_ENV: MEMBERS, CLIENT_SECRET_ENV: CLIENTS},
    )


async def test_the_clients_secret_never_links_as_a_member() -> None:
    with split_secrets_node("n") as node:
        node.start()
        with pytest.raises(ConnectionRefusedError, match="secret"):
            await asyncio.to_thread(RawPeer(node.route_url, "app", "c1", secret=CLIENTS).authenticate)
        with pytest.raises(ConnectionRefusedError, match="secret"):  # nor the members' as a client
            await asyncio.to_thread(RawPeer(node.route_url, "app", "", "client", secret=MEMBERS).authenticate)
        client = await MeshClient(node.route_url, secret=CLIENTS).connect()
        member = await asyncio.to_thread(RawPeer(node.route_url, "m", "c1", secret=MEMBERS).authenticate)
        await eventually(lambda: links_of(node, ["m"]), what="the member linked")
        member.close()
        await client.close()
        assert "one mesh secret" not in node.log_path.read_text()


async def test_the_single_secret_of_an_earlier_release_still_works_with_a_warning(
    node_n: StreamsServerProcess,  # MESHPLANE_MESH_SECRET only
) -> None:
    client = await MeshClient(node_n.route_url, secret=SECRET).connect()
    member = await asyncio.to_thread(RawPeer(node_n.route_url, "m", "c1", secret=SECRET).authenticate)
    member.close()
    await client.close()
    assert "one mesh secret for members and clients" in node_n.log_path.read_text()


async def test_a_client_certificate_never_links_as_a_member(tmp_path: Path) -> None:
    ca = MeshCA(tmp_path)
    ca.issue("n", "meshplane://node/c1/n", "127.0.0.1")
    ca.issue("app1", "meshplane://client/app1", "app1")  # its DNS name says app1 too
    ca.issue("m", "meshplane://node/c1/m")
    ca.issue("upper", "meshplane://node/c1/M")
    tls = ("--mesh-tls-cert", str(tmp_path / "n.pem"), "--mesh-tls-key", str(tmp_path / "n.key"))
    with split_secrets_node("n", *tls, "--mesh-tls-ca", str(tmp_path / "ca.pem")) as node:
        node.start()
        for name, claim, error in (
            ("app1", "app1", "a client's certificate cannot link as a route"),
            ("upper", "m", "does not name 'meshplane://node/c1/m'"),  # byte for byte
        ):
            peer = RawPeer(node.route_url, claim, "c1", secret=MEMBERS, tls=context(tmp_path, name))
            answer = await asyncio.to_thread(peer.hello)
            peer.close()
            assert error in answer.error
        assert (await status(node))["frame_errors"]["hello_identity"] == 2
        member = RawPeer(node.route_url, "m", "c1", secret=MEMBERS, tls=context(tmp_path, "m"))
        await asyncio.to_thread(member.authenticate)
        client = await MeshClient(node.route_url, secret=CLIENTS, tls=context(tmp_path, "app1")).connect()
        await client.flush()
        await client.close()
        member.close()
        assert (await status(node))["counters"].get("legacy_certificates", 0) == 0


def context(folder: Path, name: str) -> ssl.SSLContext:
    tls = ssl.create_default_context(cafile=folder / "ca.pem")
    tls.load_cert_chain(folder / f"{name}.pem", folder / f"{name}.key")
    return tls


async def links_of(node: StreamsServerProcess, peers: list[str]) -> bool:
    return [link["peer"] for link in (await status(node))["links"]] == peers


async def test_a_gateway_keeps_one_link_per_cluster() -> None:
    ports = {"gA": free_port(), "gB": free_port()}
    nodes = [
        StreamsServerProcess(
            extra_args=(
                *("--node-id", name, "--cluster", cluster, "--route-port", str(ports[name])),
                *(
                    "--gateway",
                    f"{other}=tcp://127.0.0.1:{ports['g' + other]}",
                    "--heartbeat-interval",
                    "0.2",
                ),
            ),
            env={SECRET_ENV: SECRET},
        )
        for name, cluster, other in (("gA", "A", "B"), ("gB", "B", "A"))
    ]
    with nodes[0] as a, nodes[1] as b:
        a.start()
        b.start()
        await eventually(lambda: gateway_up(b), what="A's gateway link up at B")
        second = RawPeer(b.route_url, "gA", "A", "gateway", epoch=12345, secret=SECRET)
        with pytest.raises(ConnectionRefusedError, match="cluster 'A' has a live link"):
            await asyncio.to_thread(second.authenticate)  # before issue 54: it replaced the live link
        second.close()
        assert (await status(b))["gateways"][0]["connects"] == 1
        assert await gateway_up(b)


async def gateway_up(node: StreamsServerProcess) -> bool:
    return [g["state"] for g in (await status(node))["gateways"]] == ["up"]
