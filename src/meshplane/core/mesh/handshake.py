"""The mesh handshake's proofs, sans I/O: who holds the mesh secret shows it without sending it.

Four frames open every connection (docs/security.md):

1. dialler -> node: HELLO with a fresh ``nonce`` (who it is, as what, of which cluster);
2. node -> dialler: HELLO with a fresh ``nonce`` of its own (or an ``error``, and the connection ends);
3. dialler -> node: AUTH with the dialler's proof over both nonces;
4. node -> dialler: AUTH with the node's proof, once the dialler's was right (else a HELLO with an
   error that says only why).

A proof is HMAC-SHA256, keyed by the secret, over a label for the side that proves, both nonces,
the role and both ids: it cannot be replayed on another connection (the nonces differ), turned
around (the label differs) or moved to another identity. The dialler proves first, so a connection
that does not hold the secret learns nothing it could reuse. Without a secret the key is empty:
both sides still run the exchange, and a node with a secret refuses a peer without one.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import msgspec

from meshplane.core.mesh.frames import encode_payload, payload_decoder

NONCE_BYTES = 32
PROOF_BYTES = 32


class Auth(msgspec.Struct, frozen=True):
    """AUTH's payload: a side's proof; from the node to a client, also the origin its EVENTs carry and
    the ticket that lets it keep that origin on its next connection (its resent events keep their ids)."""

    proof: bytes
    origin: str = ""
    ticket: bytes = b""


encode_auth = encode_payload
decode_auth = payload_decoder(Auth, "AUTH")


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def proof(
    secret: str,
    *,
    dialler: bool,
    dialler_nonce: bytes,
    node_nonce: bytes,
    role: str,
    dialler_id: str,
    node_id: str,
) -> bytes:
    """The proof of the side named by ``dialler`` (True: the one that connected)."""
    label = b"meshplane-dialler" if dialler else b"meshplane-node"
    message = b"\x00".join(
        (label, dialler_nonce, node_nonce, role.encode(), dialler_id.encode(), node_id.encode())
    )
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


def proof_ok(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given)


ORIGIN_BYTES = 16  # a client's origin: 16 hex digits, as a node id fills the frame's source field


def new_origin() -> str:
    return os.urandom(ORIGIN_BYTES // 2).hex()


def origin_ticket(secret: str, origin: str) -> bytes:
    """What a client shows to keep ``origin`` on a new connection: only a node (a holder of the members'
    secret) makes one, so no client can take another's origin (and, through dedup, hide its events)."""
    return hmac.new(secret.encode(), b"meshplane-origin\x00" + origin.encode(), hashlib.sha256).digest()[:16]


def resumed_origin(secret: str, origin: str, ticket: bytes) -> str:
    """``origin`` when ``ticket`` is its own, else a new one."""
    if len(origin) == ORIGIN_BYTES and proof_ok(origin_ticket(secret, origin), ticket):
        return origin
    return new_origin()
