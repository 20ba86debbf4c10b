"""ATTACK (reviewer's reproduction, failing on today's code): a mesh client posing as a node to other
clients. A node proves the *clients'* secret to a client (``Handshakes._secret``; the client checks
``proof(self.secret, ...)`` in ``MeshClient._handshake_with``), so every holder of the clients' secret,
i.e. every client, can complete the handshake as a node: on an address a client dials (the threat
model's "stranger on an address", docs/security.md) it reads the client's events, ACKs its guaranteed
events and drops them (an acknowledged event lost), and learns the client's origin and ticket from its
HELLO (to take its origin at the real node). Without TLS nothing tells a client a node from a client.
"""

from __future__ import annotations

import socket
import threading

import pytest

from meshplane.core.mesh.frames import (
    FLAG_GUARANTEED,
    PROTOCOL_VERSION,
    FrameType,
    Hello,
    decode_hello,
    encode_frame,
    encode_payload,
)
from meshplane.core.mesh.handshake import Auth, encode_auth, proof
from meshplane.errors import MeshplaneError
from meshplane.mesh.client import MeshClient
from tests.mesh_peers import RawPeer

CLIENT_SECRET = "clients-secret-0123456789abcdef"  # what every client holds; no members' secret here


def impostor(listener: socket.socket, stolen: list[bytes]) -> None:
    """A client's code playing node "n1": the handshake with the clients' secret, then an ACK for every
    guaranteed event, which goes nowhere."""
    sock, _ = listener.accept()
    sock.settimeout(10)
    peer = RawPeer("", "n1", "c1", role="client", secret=CLIENT_SECRET)
    peer.sock = sock
    client = decode_hello(peer.read_until(FrameType.HELLO).payload)
    hello = Hello(PROTOCOL_VERSION, "n1", "c1", "client", 1, peer.nonce)
    peer.send(encode_frame(FrameType.HELLO, "n1", payload=encode_payload(hello)))
    peer.read_until(FrameType.AUTH)
    ours = proof(
        CLIENT_SECRET,
        dialler=False,
        dialler_nonce=client.nonce,
        node_nonce=peer.nonce,
        role="client",
        dialler_id=client.node,
        node_id="n1",
    )
    peer.send(encode_frame(FrameType.AUTH, "n1", payload=encode_auth(Auth(ours, "00000000deadbeef"))))
    peer.seal(client.nonce, client.node, dialler=False)
    while True:
        try:
            frame = peer.read_until(FrameType.EVENT)
        except OSError:
            return
        if frame.flags & FLAG_GUARANTEED:
            stolen.append(frame.payload)
            peer.send(encode_frame(FrameType.ACK, "n1", sequence=frame.sequence))


async def test_a_client_secret_holder_cannot_pose_as_a_node_and_ack_guaranteed_events() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    stolen: list[bytes] = []
    thread = threading.Thread(target=impostor, args=(listener, stolen), daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    client = MeshClient(f"tcp://127.0.0.1:{port}", secret=CLIENT_SECRET, timeout=5)
    try:
        await client.connect()
        with pytest.raises(MeshplaneError):
            await client.publish("orders.paid", b"invoice 42", guaranteed=True)
    finally:
        await client.close()
        listener.close()
    assert not stolen, f"acknowledged by a client posing as node n1, and dropped: {stolen}"
