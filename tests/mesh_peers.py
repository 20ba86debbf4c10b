"""Raw peers of a mesh node over TCP, for tests that play a misbehaving route, gateway or client: they
speak the frames byte for byte (``meshplane.core.mesh``) with no node code behind them."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field
from typing import Literal

from meshplane.core.mesh.frames import (
    PROTOCOL_VERSION,
    Frame,
    FrameReader,
    FrameType,
    Hello,
    decode_hello,
    encode_frame,
    encode_payload,
)
from meshplane.core.mesh.handshake import Auth, decode_auth, encode_auth, new_nonce, proof

Role = Literal["route", "client", "gateway"]


def address(route_url: str) -> tuple[str, int]:
    host, port = route_url[len("tcp://") :].split(":")
    return host, int(port)


@dataclass
class RawPeer:
    """One connection to a node; ``hello`` sends HELLO and returns the node's answer, ``authenticate``
    runs the whole handshake."""

    route_url: str
    node_id: str = "intruder"
    cluster: str = "c1"
    role: Role = "route"
    epoch: int = 1
    secret: str = ""
    tls: ssl.SSLContext | None = None
    sock: socket.socket = field(init=False)
    reader: FrameReader = field(default_factory=FrameReader)
    frames: list[Frame] = field(default_factory=list)
    nonce: bytes = field(default_factory=new_nonce)
    origin: str = ""
    received: bytearray = field(default_factory=bytearray)  # every byte the node sent
    sent_auth: bytes = b""  # the AUTH frame this peer sent (to replay it)
    batched_acks: bool = False  # as a client: asks for one ACK for many stored events

    def __post_init__(self) -> None:
        if not self.route_url:
            return  # ``answer_dial`` hands it the socket a node dialled
        host, port = address(self.route_url)
        sock = socket.create_connection((host, port), timeout=10)
        self.sock = self.tls.wrap_socket(sock, server_hostname=host) if self.tls is not None else sock

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read_until(self, *kinds: FrameType) -> Frame:
        """The first frame of one of ``kinds`` (the frames before it are dropped)."""
        while True:
            for i, frame in enumerate(self.frames):
                if frame.type in kinds:
                    del self.frames[: i + 1]
                    return frame
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"the node closed the connection before a {kinds[0].name}")
            self.received += data
            self.frames += [f for f in self.reader.feed(data) if isinstance(f, Frame)]

    def closed(self, timeout: float = 10.0) -> bool:
        """Whether the node closes the connection within ``timeout`` (what it sends meanwhile is read
        into ``frames``)."""
        self.sock.settimeout(timeout)
        try:
            while data := self.sock.recv(65536):
                self.received += data
                self.frames += [f for f in self.reader.feed(data) if isinstance(f, Frame)]
        except TimeoutError:
            return False
        except OSError:
            return True
        return True

    def hello(self, protocol: int = PROTOCOL_VERSION) -> Hello:
        hello = Hello(
            protocol,
            self.node_id,
            self.cluster,
            self.role,
            self.epoch,
            self.nonce,
            batched_acks=self.batched_acks,
        )
        self.send(encode_frame(FrameType.HELLO, self.node_id, payload=encode_payload(hello)))
        return decode_hello(self.read_until(FrameType.HELLO).payload)

    def authenticate(self) -> RawPeer:
        answer = self.hello()
        if answer.error:
            raise ConnectionRefusedError(answer.error)
        ours = proof(
            self.secret,
            dialler=True,
            dialler_nonce=self.nonce,
            node_nonce=answer.nonce,
            role=self.role,
            dialler_id=self.node_id,
            node_id=answer.node,
        )
        self.sent_auth = encode_frame(FrameType.AUTH, self.node_id, payload=encode_auth(Auth(ours)))
        self.send(self.sent_auth)
        frame = self.read_until(FrameType.AUTH, FrameType.HELLO)
        if frame.type is FrameType.HELLO:
            raise ConnectionRefusedError(decode_hello(frame.payload).error)
        self.origin = decode_auth(frame.payload).origin
        return self

    def close(self) -> None:
        self.sock.close()


def answer_dial(listener: socket.socket, node_id: str, cluster: str = "c1", epoch: int = 1) -> RawPeer:
    """Play a node another node dialled (as a route, with no secret): accept its connection and
    answer its HELLO and its proof."""
    sock, _ = listener.accept()
    sock.settimeout(10)
    peer = RawPeer("", node_id, cluster, epoch=epoch)
    peer.sock = sock
    dialler = decode_hello(peer.read_until(FrameType.HELLO).payload)
    hello = Hello(PROTOCOL_VERSION, node_id, cluster, "route", epoch, peer.nonce)
    peer.send(encode_frame(FrameType.HELLO, node_id, payload=encode_payload(hello)))
    peer.read_until(FrameType.AUTH)
    ours = proof(
        "",
        dialler=False,
        dialler_nonce=dialler.nonce,
        node_nonce=peer.nonce,
        role="route",
        dialler_id=dialler.node,
        node_id=node_id,
    )
    peer.send(encode_frame(FrameType.AUTH, node_id, payload=encode_auth(Auth(ours))))
    return peer
