"""Nothing a peer says before its proof is believed, and nothing it sends before it can make a node
hold much (issue 54): a refusal only logged, a HELLO bounded, a flood of connections capped."""

from __future__ import annotations

import asyncio
import socket

from meshplane.core.mesh.frames import PROTOCOL_VERSION, FrameType, Hello, encode_frame, encode_payload
from meshplane.launchers import StreamsServerProcess
from meshplane.mesh.config import SECRET_ENV
from tests.integration.test_mesh import status
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
