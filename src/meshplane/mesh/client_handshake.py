"""A client's side of the handshake with a mesh node: HELLO, the node's challenge, both proofs
(:mod:`meshplane.core.mesh.handshake`), the session sealed, then a VPN user's LOGIN inside it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from meshplane.core.mesh.frames import (
    PROTOCOL_VERSION,
    Frame,
    FrameType,
    Hello,
    Login,
    decode_hello,
    encode_frame,
    encode_payload,
)
from meshplane.core.mesh.handshake import (
    NONCE_BYTES,
    Auth,
    decode_auth,
    encode_auth,
    new_nonce,
    proof,
    proof_ok,
)
from meshplane.core.mesh.login_checks import RETRY_LATER, WRONG
from meshplane.core.mesh.vpn import DEFAULT, bound_role
from meshplane.errors import LoginBusy, TransportAuthError, TransportError, WrongCredentials
from meshplane.mesh.config import CLIENT_SECRET_ENV
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.session import session_keys

SECRET_HINT = f"set {CLIENT_SECRET_ENV} to the nodes' secret for clients"


@dataclass(frozen=True)
class Session:
    node: str  # the node's id
    origin: str  # the source id the node gave this connection's events
    ticket: bytes  # to keep ``origin`` on the next connection


async def greet(
    conn: FrameConnection,
    answers: asyncio.Queue[Frame | None],
    *,
    url: str,
    name: str,
    secret: str,
    vpn: str,
    origin: str,
    ticket: bytes,
    user: str,
    password: str,
) -> Session:
    """Handshake on ``conn``, whose HELLO, AUTH and LOGIN frames (``None``: closed) arrive on
    ``answers``; raises why the node refused."""
    name, nonce = name.encode("ascii", "ignore")[:16].decode(), new_nonce()
    hello = Hello(
        PROTOCOL_VERSION,
        name,
        "",
        "client",
        0,
        nonce,
        batched_acks=True,
        origin=origin,
        ticket=ticket,
        vpn="" if vpn == DEFAULT else vpn,
    )
    conn.send(encode_frame(FrameType.HELLO, "", payload=encode_payload(hello)))
    answer = hello_or_refusal(await answers.get(), url)
    if len(answer.nonce) != NONCE_BYTES:
        raise TransportError(f"the mesh node at {url} sent no challenge (an older protocol?)")
    if (answer.vpn or DEFAULT) != vpn:  # a node before VPNs would put us in the default one
        raise TransportError(f"the mesh node at {url} knows no Message VPN {vpn!r}")
    role = bound_role("client", vpn)

    def proof_of(dialler: bool) -> bytes:
        return proof(
            secret,
            dialler=dialler,
            dialler_nonce=nonce,
            node_nonce=answer.nonce,
            role=role,
            dialler_id=name,
            node_id=answer.node,
        )

    conn.send(encode_frame(FrameType.AUTH, "", payload=encode_auth(Auth(proof_of(True)))))
    frame = await answers.get()
    if frame is None or frame.type is not FrameType.AUTH:
        hello_or_refusal(frame, url)
        raise TransportError(f"the mesh node at {url} answered out of turn")
    try:
        auth = decode_auth(frame.payload)
    except ValueError as exc:
        raise TransportError(f"mesh node {url}: {exc}") from None
    if not proof_ok(proof_of(False), auth.proof):
        raise TransportAuthError(
            f"the mesh node at {url} could not prove it holds the mesh secret ({SECRET_HINT})"
        )
    keys = session_keys(
        secret.encode(),
        dialler_nonce=nonce,
        node_nonce=answer.nonce,
        role=role,
        dialler_id=name,
        node_id=answer.node,
    )
    conn.seal(keys, dialler=True)
    if user:  # sealed: the password travels only inside the session
        conn.send(encode_frame(FrameType.LOGIN, "", payload=encode_payload(Login(user, password))))
        login = await answers.get()
        if login is None or login.type is not FrameType.LOGIN:
            raise ConnectionError(f"the mesh node at {url} closed the connection at login")
        if login.payload:
            reason = login.payload
            refusal = (
                LoginBusy
                if reason.endswith(RETRY_LATER.encode())
                else WrongCredentials
                if reason == WRONG.encode()
                else TransportAuthError
            )
            raise refusal(
                f"the mesh node at {url} refused user {user!r} in Message VPN {vpn!r}: "
                f"{reason.decode(errors='replace')[:200]}"
            )
    return Session(answer.node, auth.origin, auth.ticket)


def hello_or_refusal(frame: Frame | None, url: str) -> Hello:
    """The node's HELLO, or the error it stands for (a refusal, a close, a frame out of turn)."""
    if frame is None:
        raise ConnectionError(f"the mesh node at {url} closed the connection during the handshake")
    if frame.type is not FrameType.HELLO:
        raise TransportError(f"the mesh node at {url} answered out of turn")
    try:
        answer = decode_hello(frame.payload)
    except ValueError as exc:
        raise TransportError(f"mesh node {url}: {exc}") from None
    if answer.error:
        if "secret" in answer.error:
            raise TransportAuthError(f"the mesh node at {url} refused us: {answer.error} ({SECRET_HINT})")
        raise TransportError(f"the mesh node at {url} refused us: {answer.error}")
    return answer
