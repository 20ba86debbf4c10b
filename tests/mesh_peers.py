"""Raw peers of a mesh node over TCP, for tests that play a misbehaving route, gateway or client: they
speak the frames byte for byte (``meshplane.core.mesh``) with no node code behind them."""

from __future__ import annotations

import socket
import ssl
import time
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
from meshplane.mesh.session import Opener, Sealer, session_keys

Role = Literal["route", "client", "gateway", "mate"]


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
    sealer: Sealer | None = None  # once the handshake is done, what it sends and reads is in records
    opener: Opener | None = None

    def __post_init__(self) -> None:
        if not self.route_url:
            return  # ``answer_dial`` hands it the socket a node dialled
        host, port = address(self.route_url)
        sock = socket.create_connection((host, port), timeout=10)
        self.sock = self.tls.wrap_socket(sock, server_hostname=host) if self.tls is not None else sock

    def send(self, *frames: bytes) -> None:
        data = b"".join(frames)
        self.sock.sendall(self.sealer.seal(data) if self.sealer is not None else data)

    def receive(self, data: bytes) -> None:
        """Bytes the node sent (as read from the socket) into ``frames``."""
        self.received += data
        if self.opener is not None:
            data = self.opener.feed(data)
        self.frames += [f for f in self.reader.feed(data) if isinstance(f, Frame)]

    def seal(self, peer_nonce: bytes, peer_id: str, *, dialler: bool) -> None:
        """Both proofs are in: records from now on (the dialler's first, empty, confirms it)."""
        keys = session_keys(
            self.secret.encode(),
            dialler_nonce=self.nonce if dialler else peer_nonce,
            node_nonce=peer_nonce if dialler else self.nonce,
            role=self.role,
            dialler_id=self.node_id if dialler else peer_id,
            node_id=peer_id if dialler else self.node_id,
        )
        self.sealer, self.opener = keys.sealer(dialler), keys.opener(dialler)
        if dialler:
            self.send()

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
            self.receive(data)

    def closed(self, timeout: float = 10.0) -> bool:
        """Whether the node closes the connection within ``timeout`` (what it sends meanwhile is read
        into ``frames``)."""
        self.sock.settimeout(timeout)
        try:
            while data := self.sock.recv(65536):
                self.receive(data)
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
        answer = self.prove()
        self.seal(answer.nonce, answer.node, dialler=True)
        return self

    def prove(self, pause: float = 0.0) -> Hello:
        """The handshake up to the node's proof (``pause`` seconds between its HELLO and our AUTH),
        short of our first record, which confirms it: returns the node's HELLO, to ``seal`` with."""
        answer = self.hello()
        if answer.error:
            raise ConnectionRefusedError(answer.error)
        time.sleep(pause)
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
        return answer

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
    peer.seal(dialler.nonce, dialler.node, dialler=False)
    return peer


def relay_handshake(
    dialled: socket.socket, target_url: str, tls: ssl.SSLContext | None = None
) -> tuple[RawPeer, RawPeer]:
    """Play a stranger on an address a node dials: forward the dialler's HELLO and AUTH to the node at
    ``target_url`` and that node's answers back, frame by frame, then stop relaying. Returns (the
    dialler's side, the target's side) as raw peers, to speak as the dialler on the second."""
    dialler = RawPeer("", "?")
    dialler.sock = dialled
    dialled.settimeout(10)
    target = RawPeer(target_url, "?", tls=tls)
    for source, sink, kind in (
        (dialler, target, FrameType.HELLO),
        (target, dialler, FrameType.HELLO),
        (dialler, target, FrameType.AUTH),
        (target, dialler, FrameType.AUTH),
    ):
        frame = source.read_until(kind, FrameType.HELLO)
        sink.send(frame.raw)
        if frame.type is FrameType.HELLO and kind is FrameType.HELLO:
            hello = decode_hello(frame.payload)
            if source is dialler:
                dialler.node_id, dialler.cluster, dialler.role = hello.node, hello.cluster, hello.role
        elif frame.type is FrameType.HELLO:
            raise ConnectionRefusedError(decode_hello(frame.payload).error)
    target.node_id, target.cluster, target.role = dialler.node_id, dialler.cluster, dialler.role
    return dialler, target
