"""The HA standby's side (:mod:`.mates` is the active's): it follows the active its etcd record names,
after checking that the active is the node it says (its HELLO and certificate) and proving itself, and
applies the changes of the epoch it read in etcd until etcd expires the active's lease and it may take
it (:meth:`Standby.run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import Counter

from meshplane.core.mesh.frames import (
    PROTOCOL_VERSION,
    Frame,
    FrameError,
    FrameType,
    Hello,
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
from meshplane.core.mesh.identity import Match, match_member, member_uri
from meshplane.core.mirror import Barrier, decode_changes
from meshplane.errors import DiscoveryError
from meshplane.mesh.config import parse_route
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.lease import ActiveMate, MateLease
from meshplane.mesh.preauth import bounded
from meshplane.mesh.session import session_keys
from meshplane.streams.mirror import DirectoryReplica

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0  # the standby's MIRROR_ACK 0: keeps the connection from idling out


class Standby:
    """The standby's side: mirrors the active its etcd record names, until it may take the lease."""

    def __init__(
        self,
        replica: DirectoryReplica,
        lease: MateLease,
        *,
        node_id: str,
        cluster: str,
        secret: str,
        tls: ssl.SSLContext | None,
        max_payload: int,
        poll: float = 0.25,
    ) -> None:
        self.replica = replica
        self.lease = lease
        self.node_id = node_id
        self.cluster = cluster
        self.secret = secret
        self.tls = tls
        self.max_payload = max_payload
        self.poll = poll
        self.barriers = 0
        self.counters: Counter[str] = Counter()  # actives refused (``impostors``)
        self._following: ActiveMate | None = None
        self._frames: asyncio.Queue[Frame | None] = asyncio.Queue()
        self._authenticated = False

    async def run(self, stop: asyncio.Event) -> bool:
        """Mirror the active until this mate has taken the lease (True) or ``stop`` is set (False)."""
        said = ""
        while not stop.is_set():
            try:
                active = await self.lease.active()
                if active is None:
                    if await self.lease.acquire():
                        return True
                    line = (
                        "the lease is free but etcd does not count this mate as current: waiting for a "
                        "mate it names (if every one of them is gone for good, and what only they held "
                        f"may be lost: {self.lease.reset_command})"
                    )
                elif active.token != self.lease.token and active.route:
                    await self._follow(active, stop)
                    line = f"the active (epoch {active.epoch}) went away; looking again"
                else:
                    line = f"waiting for the active (epoch {active.epoch}) to publish its address"
            except (DiscoveryError, OSError, ConnectionError, TimeoutError) as exc:
                line = f"cannot follow the active yet: {exc}"
            if line != said:
                log.warning("HA mate (standby): %s", line)
                said = line
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await stop.wait()
        return False

    async def _follow(self, active: ActiveMate, stop: asyncio.Event) -> None:
        host, port = parse_route(active.route)
        loop = asyncio.get_running_loop()
        self._frames = asyncio.Queue()
        self._authenticated = False
        async with asyncio.timeout(5):
            _, conn = await loop.create_connection(
                self._protocol, host, port, ssl=self.tls, server_hostname=host if self.tls else None
            )
        try:
            async with asyncio.timeout(5):
                await self._handshake(conn)
            self._following, self._authenticated = active, True
            log.warning(
                "HA mate (standby): following the active at %s (epoch %d)", active.route, active.epoch
            )
            conn.send(encode_frame(FrameType.MIRROR_ACK, self.node_id, self.lease.token, 0))
            while conn.is_open and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HEARTBEAT_SECONDS):
                        await asyncio.shield(conn.closed)
                now = await self.lease.active()
                if now is None or now.epoch != active.epoch:
                    break  # the active lost its lease: what it sends now is not applied
                conn.send(encode_frame(FrameType.MIRROR_ACK, self.node_id, self.lease.token, 0))
        finally:
            self._following = None
            conn.close()

    async def _handshake(self, conn: FrameConnection) -> None:
        nonce = new_nonce()
        hello = Hello(PROTOCOL_VERSION, self.node_id, self.cluster, "mate", 0, nonce)
        conn.send(encode_frame(FrameType.HELLO, self.node_id, payload=encode_payload(hello)))
        answer = decode_hello(self._expect(await self._frames.get(), FrameType.HELLO).payload)
        if answer.error or len(answer.nonce) != NONCE_BYTES:
            raise ConnectionError(f"the active refused this mate: {bounded(answer.error) or 'no challenge'}")
        if (answer.node, answer.cluster, answer.role) != (self.node_id, self.cluster, "mate"):
            raise ConnectionError(
                f"the active answered as {bounded(answer.node)} ({answer.role}), not as this mate"
            )
        self._check_certificate(conn)

        def proof_of(dialler: bool) -> bytes:
            return proof(
                self.secret,
                dialler=dialler,
                dialler_nonce=nonce,
                node_nonce=answer.nonce,
                role="mate",
                dialler_id=self.node_id,
                node_id=self.node_id,
            )

        conn.send(encode_frame(FrameType.AUTH, self.node_id, payload=encode_auth(Auth(proof_of(True)))))
        frame = self._expect(await self._frames.get(), FrameType.AUTH)
        if not proof_ok(proof_of(False), decode_auth(frame.payload).proof):
            raise ConnectionError("the active could not prove the mesh secret")
        keys = session_keys(
            self.secret.encode(),
            dialler_nonce=nonce,
            node_nonce=answer.nonce,
            role="mate",
            dialler_id=self.node_id,
            node_id=self.node_id,
        )
        conn.seal(keys, dialler=True)

    def _check_certificate(self, conn: FrameConnection) -> None:
        """With TLS, the active's certificate must name this node (a member's URI; an earlier release's
        DNS name or common name, with a warning): a client's certificate never makes an active."""
        if self.tls is None or conn.transport is None:
            return
        ssl_object = conn.transport.get_extra_info("ssl_object")
        peercert = ssl_object.getpeercert() if isinstance(ssl_object, ssl.SSLObject) else None
        match = match_member(peercert, self.cluster, self.node_id, (self.node_id,))
        if match is Match.LEGACY:
            log.warning(
                "HA mate (standby): the active's certificate has no meshplane:// URI (one more release)"
            )
        elif match is not Match.EXACT:
            self.counters["impostors"] += 1
            raise ConnectionError(
                f"the active's certificate does not name {member_uri(self.cluster, self.node_id)}"
            )

    @staticmethod
    def _expect(frame: Frame | None, kind: FrameType) -> Frame:
        if frame is None:
            raise ConnectionError("the active closed the connection during the handshake")
        if frame.type is FrameType.HELLO and kind is FrameType.AUTH:
            error = decode_hello(frame.payload).error
            raise ConnectionError(f"the active refused this mate: {error}")
        if frame.type is not kind:
            raise ConnectionError(f"the active answered {frame.type.name}, not {kind.name}")
        return frame

    def _protocol(self) -> FrameConnection:
        return FrameConnection(
            max_payload=self.max_payload,
            batch_size=64,
            batch_timeout_ms=0,
            on_frame=self._on_frame,
            on_bad=self._on_bad,
            on_close=lambda conn: self._frames.put_nowait(None),
        )

    def _on_bad(self, conn: FrameConnection, error: FrameError) -> None:
        log.warning("HA mate (standby): bad frame from the active: %s", error.detail)
        conn.close()  # a gap in the changes: follow again from a snapshot

    def _on_frame(self, conn: FrameConnection, frame: Frame) -> None:
        if not self._authenticated:
            self._frames.put_nowait(frame)
            return
        following = self._following
        if frame.type is not FrameType.MIRROR or following is None or frame.sequence != following.epoch:
            log.warning(
                "HA mate (standby): %s of epoch %d ignored; reconnecting", frame.type.name, frame.sequence
            )
            conn.close()
            return
        try:
            changes = decode_changes(frame.payload).changes
            for change in changes:
                if isinstance(change, Barrier):
                    if change.sync:
                        self.replica.sync()
                    self.barriers += 1
                    conn.send(
                        encode_frame(FrameType.MIRROR_ACK, self.node_id, self.lease.token, change.number)
                    )
                else:
                    self.replica.apply(change)
        except (ValueError, OSError) as exc:
            log.error("HA mate (standby): cannot apply the active's changes (%s); following again", exc)
            conn.close()
