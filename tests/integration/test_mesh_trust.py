"""Nothing a peer says before its proof is believed, and nothing it sends before it can make a node
hold much (issue 54): a refusal only logged, a HELLO bounded, a flood of connections capped."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from meshplane.core.mesh.frames import (
    FLAG_GUARANTEED,
    PROTOCOL_VERSION,
    FrameType,
    Hello,
    encode_event,
    encode_frame,
    encode_payload,
)
from meshplane.launchers import StreamsServerProcess
from meshplane.mesh.client import MeshClient
from meshplane.mesh.config import SECRET_ENV
from tests.helpers import eventually
from tests.integration.test_mesh import Inbox, status
from tests.mesh_peers import RawPeer

SECRET = "the-mesh-secret-nobody-else-knows"


def node_process(node_id: str, *args: str) -> StreamsServerProcess:
    return StreamsServerProcess(
        extra_args=("--node-id", node_id, "--cluster", "c1", "--route-port", "0", *args),
        env={SECRET_ENV: SECRET},
    )


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


async def test_an_8_mib_hello_is_cut_off_at_its_header_and_memory_and_log_stay_bounded() -> None:
    with node_process("n") as node:
        node.start()
        before, log_before = rss_mb(node), node.log_path.stat().st_size
        frame = hello_frame("x" * (8 << 20), "client")
        for _ in range(5):  # 150 connections, 30 at once (under the per-address cap)
            await asyncio.gather(*(asyncio.to_thread(send_quietly, node.route_url, frame) for _ in range(30)))
        counters = (await status(node))["counters"]
        assert counters["closed_hello_too_large"] == 150
        assert rss_mb(node) - before < 40  # before issue 54: 150 x 8 MiB held until the deadline
        assert node.log_path.stat().st_size - log_before < 16_000  # a line a second at most
        client = await MeshClient(node.route_url, secret=SECRET).connect()
        await client.flush()  # everyone else is served
        await client.close()


async def test_a_flood_of_long_invalid_ids_echoes_and_logs_a_bounded_text() -> None:
    with node_process("n") as node:
        node.start()
        log_before = node.log_path.stat().st_size
        frame = hello_frame("\u212a" * 1000)  # non-ASCII (a Kelvin sign), and far longer than an id
        answers = []
        for _ in range(10):
            answers += await asyncio.gather(
                *(asyncio.to_thread(send_quietly, node.route_url, frame) for _ in range(20))
            )
        assert all(0 < len(answer) < 600 for answer in answers)  # the refusal, without the id
        assert (await status(node))["frame_errors"]["hello_malformed"] == 200
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


async def test_a_member_stamping_another_nodes_origin_hides_none_of_its_events() -> None:
    with node_process("b") as node:
        node.start()
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


async def test_a_clients_guaranteed_event_must_carry_the_origin_the_node_gave_it() -> None:
    with node_process("b") as node:
        node.start()
        client = await asyncio.to_thread(
            RawPeer(node.route_url, "app", "", "client", secret=SECRET).authenticate
        )
        for source, sequence in (("b", 1), (client.origin, 2)):
            client.send(encode_event(source, "orders.eu", sequence, 1000, b"x", FLAG_GUARANTEED))
            ack = await asyncio.to_thread(client.read_until, FrameType.ACK)
            assert ack.sequence == sequence
            assert (b"origin" in ack.payload) == (source != client.origin)
        assert (await status(node))["frame_errors"]["foreign_origin"] == 1
        client.close()
