"""A node's side of the handshake (:mod:`meshplane.core.mesh.handshake`): HELLO, the challenge, both
proofs, and only then a link, an external link or a client session.

Nothing is kept for a connection before its proof is checked: no Link, no Bloom filter, no session;
a refusal says only why (``hello_<reason>`` counted). With TLS the peer's certificate must name the
id its HELLO claims (a route's node id, a gateway's cluster), as nats-server maps route certificates.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING, Literal

from meshplane.core.mesh.frames import (
    PROTOCOL_VERSION,
    Frame,
    FrameType,
    Hello,
    check_hello_ids,
    check_node_id,
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
    origin_ticket,
    proof,
    proof_ok,
    resumed_origin,
)
from meshplane.core.mesh.identity import Match, match_client, match_member, member_uri
from meshplane.core.mesh.vpn import DEFAULT, bound_role
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.links import Handshake, Link
from meshplane.mesh.preauth import TEXT_IN_LOGS, QuietLog, Unproven, bounded
from meshplane.mesh.session import SessionKeys, session_keys

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

log = logging.getLogger(__name__)

MAX_CLUSTER_BYTES = 64


class Handshakes:
    def __init__(self, node: MeshNode) -> None:
        self.node = node
        limits = node.config.limits
        self.unproven: Unproven[Handshake] = Unproven(
            limits.max_unauthenticated, limits.max_unauthenticated_per_address
        )
        self.quiet = QuietLog(log)

    def opened(self, state: Handshake) -> None:
        state.nonce = new_nonce()
        node = self.node
        if state.dialed:
            role: Literal["route", "gateway"] = "gateway" if state.dial_role == "gateway" else "route"
            self.send_hello(state.conn, role, nonce=state.nonce)
            timeout = node.config.handshake_timeout
        else:
            transport = state.conn.transport
            peername = transport.get_extra_info("peername") if transport is not None else None
            address = str(peername[0]) if isinstance(peername, tuple) else str(peername)
            refused, oldest = self.unproven.admit(state, address)
            if refused:  # closed before anything is read (counted and logged as ``closed_<refused>``)
                state.conn.limit(refused)
                return
            if oldest is not None:  # all slots taken: the longest unproven makes room
                oldest.address = None
                node.frame_errors["unproven_evicted"] += 1
                oldest.conn.close()
            state.address = address
            timeout = node.config.limits.auth_timeout
        self._arm_deadline(state, timeout)

    def _arm_deadline(self, state: Handshake, timeout: float) -> None:
        if state.deadline is not None:
            state.deadline.cancel()
        state.deadline = asyncio.get_running_loop().call_later(timeout, self._deadline, state)

    def proven(self, state: Handshake) -> None:
        """The connection's handshake is over (it was installed, or it closed)."""
        if state.deadline is not None:
            state.deadline.cancel()
            state.deadline = None
        if state.address is not None:
            self.unproven.done(state)
            state.address = None

    def _deadline(self, state: Handshake) -> None:
        if not state.role and state.conn.is_open:
            self.node.frame_errors["handshake_timeout"] += 1
            self.quiet.warning("handshake_timeout", "closed a connection whose handshake ran out of time")
            state.conn.close()

    def send_hello(
        self,
        conn: FrameConnection,
        role: Literal["route", "client", "gateway", "mate"],
        error: str = "",
        nonce: bytes = b"",
        vpn: str = "",
    ) -> None:
        """HELLO never carries the secret: ``nonce`` is this side's challenge; ``vpn`` the one a client
        is given (echoed, so a client of a VPN can tell a node that knows none)."""
        node = self.node
        hello = Hello(
            PROTOCOL_VERSION,
            node.node_id,
            node.config.cluster,
            role,
            node.epoch,
            nonce,
            error,
            vpn=vpn,
            interest_batches=role in ("route", "gateway") and "no_interest_batches" not in node.config.faults,
        )
        conn.send(encode_frame(FrameType.HELLO, node.node_id, payload=encode_payload(hello)))

    def refuse(self, state: Handshake, reason: str, detail: str) -> None:
        """Counted as ``hello_<reason>``; the other side is told only ``detail``."""
        self.node.frame_errors[f"hello_{reason}"] += 1
        self.quiet.warning(reason, "refused a connection: %s", detail)
        if not state.dialed:
            self.send_hello(state.conn, "route", error=detail)
        state.error = reason
        state.conn.close()

    def on_frame(self, state: Handshake, frame: Frame) -> None:
        """A frame on a connection whose handshake is not complete."""
        if frame.type is FrameType.HELLO and state.hello is None:
            self._on_hello(state, frame)
        elif frame.type is FrameType.AUTH and state.hello is not None:
            self._on_auth(state, frame)
        elif frame.type is FrameType.HELLO:  # an answer that refuses our proof
            self._refused(state, frame)
        else:
            self.node.frame_errors["before_hello"] += 1
            state.conn.close()

    def _refused(self, state: Handshake, frame: Frame) -> None:
        """A refusal from the other side: only logged (cut to a bound) and the dial retried. It comes
        before any proof, so nothing it says is believed ("self" is decided here, in :meth:`_check`)."""
        try:
            error = decode_hello(frame.payload).error
        except ValueError:
            error = ""
        self.node.frame_errors["refused_by_peer"] += 1
        if state.error != "self":
            state.error = "refused"
        self.quiet.warning(
            "refused_by_peer",
            "node at %s refused this node: %s",
            state.conn.peer or "a route",
            bounded(error) or "(no reason)",
        )
        state.conn.close()

    def _on_hello(self, state: Handshake, frame: Frame) -> None:
        try:
            hello = decode_hello(frame.payload)
            check_hello_ids(hello)
        except ValueError as exc:
            return self.refuse(state, "malformed", str(exc)[:TEXT_IN_LOGS])
        if hello.error:
            return self._refused(state, frame)
        if hello.protocol != PROTOCOL_VERSION:
            return self.refuse(
                state, "version", f"protocol {hello.protocol}; this node speaks {PROTOCOL_VERSION}"
            )
        if len(hello.nonce) != NONCE_BYTES:
            return self.refuse(state, "malformed", f"a HELLO needs a {NONCE_BYTES}-byte nonce")
        if state.dialed and hello.role != state.dial_role:
            return self.refuse(state, "malformed", f"answered as {hello.role}, dialled as {state.dial_role}")
        problem = self._check(state, hello)
        if problem is not None:
            return self.refuse(state, *problem)
        state.hello = hello
        if state.dialed:  # the dialler proves first: a node that cannot check it learns nothing
            self._send_proof(state, hello)
            state.proved = True
        else:
            if hello.role == "client":
                # The client stamps its EVENTs with this origin, so the node passes them on unchanged;
                # random, so that event ids ({timestamp}-{sequence}-{origin}) stay unique in the mesh,
                # and kept across connections by a ticket only a node can make (resends keep their ids).
                state.origin = resumed_origin(self.node.config.secret, hello.origin, hello.ticket)
            self.send_hello(state.conn, hello.role, nonce=state.nonce, vpn=hello.vpn)

    def _check(self, state: Handshake, hello: Hello) -> tuple[str, str] | None:
        """Why a HELLO is refused before any proof, or None."""
        node = self.node
        if hello.role == "client":
            if state.dialed or len(node.clients.sessions) >= node.config.max_clients:
                return "limit", f"{node.config.max_clients} clients (the limit)"
            return self._certificate(state, hello)  # its VPN once it has proven the secret: _vpn_refused
        if hello.role == "mate":
            if node.mirror is None:
                return "mate", "this node has no HA mate (no --mates-etcd)"
            if hello.node != node.node_id or hello.cluster != node.config.cluster:
                return "mate", f"a mate of {node.node_id!r} in cluster {node.config.cluster!r} only"
            return self._certificate(state, hello)
        if hello.role == "gateway":
            cluster = hello.cluster
            if not node.gateways.enabled:
                return "gateway", "this node is not a gateway (no --gateway)"
            if cluster not in node.gateways.remote or cluster == node.config.cluster:
                return "gateway", f"cluster {cluster[:MAX_CLUSTER_BYTES]!r} is not one this gateway links to"
            return self._certificate(state, hello)
        try:
            check_node_id(hello.node)
        except ValueError as exc:
            return "malformed", str(exc)
        if hello.node == node.node_id:
            return self._self_or_impostor(hello)
        if hello.cluster != node.config.cluster:
            theirs = hello.cluster[:MAX_CLUSTER_BYTES]
            return "cluster", f"cluster {theirs!r}; this node is in {node.config.cluster!r}"
        return self._certificate(state, hello)

    def _vpn_refused(self, hello: Hello) -> tuple[str, str] | None:
        """Why a client that proved the clients' secret may not join the VPN it names, or None (a
        stranger is told neither which VPNs this node has nor which are full)."""
        node = self.node
        vpn = node.config.vpns.get(hello.vpn or DEFAULT)
        if vpn is None:
            return "vpn", f"no Message VPN {bounded(hello.vpn)} on this node"
        full = node.logins.connections_full(vpn)
        return ("vpn_limit", full) if full else None

    def _self_or_impostor(self, hello: Hello) -> tuple[str, str]:
        """A route HELLO with this node's id: this very process (its epoch, and the nonce of one of its
        own dials; its dial is then slowed, never stopped), or another claiming the id."""
        node = self.node
        dials = [s for s in node.conns.values() if s.dialed and s.nonce == hello.nonce]
        if hello.epoch == node.epoch and dials:
            for state in dials:
                state.error = "self"
            return "self", "self: a route to this node itself"
        return "self_id", "another process claims this node's id"

    def _certificate(self, state: Handshake, hello: Hello) -> tuple[str, str] | None:
        """With TLS, the peer's certificate must name the role and identity its HELLO claims
        (:mod:`meshplane.core.mesh.identity`): a member's URI for a route, gateway or mate; a client's
        (or a member's) for a client."""
        transport = state.conn.transport
        if self.node.config.tls is None or transport is None:
            return None
        ssl_object = transport.get_extra_info("ssl_object")
        peercert = ssl_object.getpeercert() if isinstance(ssl_object, ssl.SSLObject) else None
        expected = member_uri(hello.cluster, hello.node)
        if hello.role == "client":
            if not peercert:
                return None  # a node without --mesh-tls-ca asks for no client certificate
            match = match_client(peercert)
        else:
            legacy = (hello.cluster,) if hello.role == "gateway" else (hello.node,)
            match = match_member(peercert, hello.cluster, hello.node, legacy)
        if match is Match.EXACT:
            return None
        if match is Match.LEGACY:
            self.node.counters["legacy_certificates"] += 1
            self.quiet.warning(
                "legacy_certificate",
                "a %s certificate with no meshplane:// URI (its DNS name or common name taken as the id): "
                "accepted for one more release; issue certificates naming %s",
                hello.role,
                "meshplane://client/<name>" if hello.role == "client" else expected,
            )
            return None
        if match is Match.CLIENT:
            return "identity", f"a client's certificate cannot link as a {hello.role}"
        if hello.role == "client":
            return "identity", "the certificate names no meshplane client or node"
        return "identity", f"the certificate does not name {bounded(expected)}"

    def _nonces(self, state: Handshake, hello: Hello) -> tuple[bytes, bytes, str, str]:
        node_id = self.node.node_id
        if state.dialed:
            return state.nonce, hello.nonce, node_id, hello.node
        return hello.nonce, state.nonce, hello.node, node_id

    def _proof(self, state: Handshake, hello: Hello, *, dialler: bool) -> bytes:
        dialler_nonce, node_nonce, dialler_id, node_id = self._nonces(state, hello)
        return proof(
            self._secret(hello),
            dialler=dialler,
            dialler_nonce=dialler_nonce,
            node_nonce=node_nonce,
            role=bound_role(hello.role, hello.vpn),
            dialler_id=dialler_id,
            node_id=node_id,
        )

    def _secret(self, hello: Hello) -> str:
        """Clients prove the clients' secret, members (routes, gateways, mates) the members'."""
        config = self.node.config
        return (config.client_secret or "") if hello.role == "client" else config.secret

    def _keys(self, state: Handshake, hello: Hello) -> SessionKeys:
        dialler_nonce, node_nonce, dialler_id, node_id = self._nonces(state, hello)
        return session_keys(
            self._secret(hello).encode(),
            dialler_nonce=dialler_nonce,
            node_nonce=node_nonce,
            role=bound_role(hello.role, hello.vpn),
            dialler_id=dialler_id,
            node_id=node_id,
        )

    def _send_proof(self, state: Handshake, hello: Hello, origin: str = "") -> None:
        own = self._proof(state, hello, dialler=state.dialed)
        ticket = origin_ticket(self.node.config.secret, origin) if origin else b""
        payload = encode_auth(Auth(own, origin, ticket))
        state.conn.send(encode_frame(FrameType.AUTH, self.node.node_id, payload=payload))

    def _on_auth(self, state: Handshake, frame: Frame) -> None:
        node, hello = self.node, state.hello
        assert hello is not None
        try:
            auth = decode_auth(frame.payload)
        except ValueError as exc:
            return self.refuse(state, "malformed", str(exc))
        if not proof_ok(self._proof(state, hello, dialler=not state.dialed), auth.proof):
            if state.dialed:
                node.frame_errors["hello_auth"] += 1
                log.warning("the node at %s could not prove the mesh secret: not linked", state.conn.peer)
                state.error = "auth"
                return state.conn.close()
            return self.refuse(state, "auth", "wrong or missing mesh secret")
        if hello.role in ("route", "gateway"):
            taken = self._link_taken(state, hello)
            if taken is not None:
                return self.refuse(state, *taken)
        if hello.role == "client":
            refused = self._vpn_refused(hello)
            if refused is not None:
                return self.refuse(state, *refused)
        keys = self._keys(state, hello)
        if state.dialed:
            state.conn.seal(keys, dialler=True)
            return self._install(state, hello)
        self._send_proof(state, hello, state.origin)
        # Installed once the dialler's first record opens: whoever relayed the handshake holds no keys.
        # The dialler was told it is in: that record has an auth timeout of its own, from now.
        self._arm_deadline(state, node.config.limits.auth_timeout)
        state.conn.seal(keys, dialler=False, on_confirmed=lambda _: self._confirmed(state, hello))

    def _confirmed(self, state: Handshake, hello: Hello) -> None:
        if hello.role in ("route", "gateway"):
            taken = self._link_taken(state, hello)
            if taken is not None:  # another connection took the link meanwhile
                return self.refuse(state, *taken)
        self._install(state, hello)

    def _install(self, state: Handshake, hello: Hello) -> None:
        node = self.node
        self.proven(state)
        if hello.role == "route":
            node.routes.install(state, hello)
        elif hello.role == "gateway":
            node.gateways.install(state, hello)
        elif hello.role == "mate" and node.mirror is not None:
            node.mirror.accept(state)
        else:
            node.clients.accept(state)

    def _link_taken(self, state: Handshake, hello: Hello) -> tuple[str, str] | None:
        """Why an authenticated route or gateway HELLO may not take the link (reason, detail), or None.
        One link per node (a route) or cluster (a gateway): a link carried by a live connection is never
        taken over by another process of the same id (another epoch); two connections from the same
        process (both ends dialled) are paired as :meth:`Routes.install` says."""
        node = self.node
        link: Link | None
        if hello.role == "gateway":
            name, link = hello.cluster, node.gateways.links.get(hello.cluster)
            claim = f"cluster {name!r}"
        else:
            name, link = hello.node, node.links.get(hello.node)
            claim = f"node {name!r}"
        if link is None or link.conn is None or link.conn is state.conn or not link.conn.is_open:
            if hello.role == "route" and link is None and len(node.links) >= node.config.limits.max_routes:
                return "limit", f"{node.config.limits.max_routes} route peers (the limit)"
            return None
        if link.epoch != hello.epoch:
            return "duplicate", f"duplicate: {claim} has a live link from another process"
        if time.monotonic() - link.since > node.config.handshake_timeout:
            # Both ends dial at once only as a link (re)starts: a second connection later is a claim.
            return "duplicate", f"duplicate: {claim} has a live link"
        return None
