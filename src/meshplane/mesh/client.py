"""A client of one mesh node (what ``DYN_EVENT_PLANE=mesh`` uses): publish to subjects, subscribe to
patterns, one TCP connection speaking the link protocol's frames.

The client says HELLO as a ``client``; its SUB_ADD / SUB_REMOVE name patterns (one per pattern,
however many local subscriptions share it) and its EVENTs are re-originated by the node. A SYNC_REQ
with an empty payload is a ping: the node answers SYNC_RESP once everything sent before it was
handled, which is what :meth:`MeshClient.flush` waits for. When the node goes away the client dials
again with backoff and subscribes afresh; what is published meanwhile is dropped and counted.

A guaranteed publish (``guaranteed=True``) waits for the node's ACK: the event is stored wherever it
must go. Until then it is kept, and sent again as it was (same event id) after a reconnect, or when
the node answers that it cannot tell whether it is stored (an HA mate that lost its lease), so the
destination's dedup makes the resend harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import ssl
import time
from collections import deque
from collections.abc import Callable

from meshplane.core.mesh.frames import (
    DEFAULT_MAX_PAYLOAD,
    FLAG_BATCHED_ACKS,
    FLAG_GUARANTEED,
    FLAG_PROPAGATED,
    PROTOCOL_VERSION,
    STAMP_BYTES,
    Frame,
    FrameError,
    FrameType,
    Hello,
    Login,
    batched_ack_sequences,
    decode_hello,
    encode_event,
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
from meshplane.core.mesh.vpn import DEFAULT, bound_role, check_vpn, outward, prefix_of
from meshplane.core.subjects import PatternIndex
from meshplane.errors import (
    LoginBusy,
    PermissionDenied,
    TransportAuthError,
    TransportError,
    WrongCredentials,
)
from meshplane.mesh.config import CLIENT_SECRET_ENV, parse_node_urls, secret_from_env
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.session import session_keys
from meshplane.mesh.unconfirmed import Unconfirmed

log = logging.getLogger(__name__)

Callback = Callable[[str, bytes], None]


class MeshClient:
    def __init__(
        self,
        url: str,
        *,
        secret: str | None = None,
        timeout: float = 10.0,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        name: str = "meshplane",
        tls: ssl.SSLContext | None = None,
        vpn: str = DEFAULT,
        user: str = "",
        password: str | None = None,
        on_error: Callable[[PermissionDenied], None] | None = None,
    ) -> None:
        """``vpn``: the Message VPN to publish and subscribe in (the node must have it); ``user``: log
        in to it as this user, with ``password`` (default: ``$MESHPLANE_MESH_PASSWORD``; never argv).
        What the user's permissions refuse is given to ``on_error`` and raised by the next ``flush``."""
        self.url = url
        self.vpn = check_vpn(vpn)
        self._prefix = prefix_of(self.vpn)  # on every subject and pattern sent, off every one received
        self.user = user
        self._password = os.environ.get(PASSWORD_ENV, "") if password is None else password
        self.on_error = on_error
        self.refused: deque[PermissionDenied] = deque(maxlen=100)  # not yet raised by flush
        self.addresses = parse_node_urls(url)
        self._next_address = 0
        self.secret = secret_from_env(CLIENT_SECRET_ENV) if secret is None else secret  # never on argv
        self.timeout = timeout
        self.max_payload = max_payload
        self.name = name
        self.node = ""  # the node's id, once connected
        self._origin = ""  # the source id the node gave this connection's events
        self.dropped_disconnected = 0
        self.bad_frames = 0
        self._conn: FrameConnection | None = None
        self.tls = tls
        self._handshake: asyncio.Queue[Frame | None] | None = None  # HELLO and AUTH while connecting
        self._pings: list[asyncio.Future[None]] = []
        self._subs: dict[int, tuple[str, Callback]] = {}
        self._trie: PatternIndex[int] = PatternIndex()
        self._patterns: dict[str, int] = {}
        self._cache: dict[str, list[Callback]] = {}
        self._ids = itertools.count(1)
        self._sequence = itertools.count(1)
        self._closing = False
        self._reconnect: asyncio.Task[None] | None = None
        self._ticket = b""  # the node's, to keep ``_origin`` on the next connection
        self._unconfirmed = Unconfirmed(MAX_UNCONFIRMED, self.url)
        self._refused_login: TransportAuthError | None = None  # why it stopped reconnecting

    # --- connection ----------------------------------------------------------------------------------

    async def connect(self) -> MeshClient:
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            try:
                await self._connect_once(max(0.1, deadline - time.monotonic()))
                return self
            except ssl.SSLCertVerificationError as exc:  # the node runs: retrying changes nothing
                raise TransportError(await self._why_not_verified(exc)) from None
            except LoginBusy:  # a burst of logins past the node's queue of checks: each retries
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(1.0, delay * 2)
            except (OSError, TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise TransportError(
                        f"cannot reach the mesh node at {self.url} within {self.timeout}s ({exc}); start "
                        "`meshplane serve --node-id ...` or point MESHPLANE_NODE at one"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def _why_not_verified(self, exc: ssl.SSLCertVerificationError) -> str:
        """Which name was expected and which the node's certificate has (read again, unverified)."""
        from meshplane.certs import refusal

        host, port = self.addresses[(self._next_address - 1) % len(self.addresses)]
        reason = exc.verify_message or exc
        return await refusal(f"the mesh node at {self.url}", host, port, reason, "MESHPLANE_MESH_TLS_CA")

    async def _connect_once(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._handshake = asyncio.Queue()
        # An HA pair's mates in turn: the standby does not listen until it has taken over. A node that
        # closes during the handshake makes the next attempt go to the next address at once.
        host, port = self.addresses[self._next_address % len(self.addresses)]
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    self._protocol, host, port, ssl=self.tls, server_hostname=host if self.tls else None
                )
                try:
                    origin = await self._handshake_with(conn)
                except BaseException:
                    conn.close()
                    raise
        except (OSError, TimeoutError, ConnectionError):
            self._next_address += 1
            raise
        finally:
            self._handshake = None
        self._origin = origin
        self._conn = conn
        for pattern in self._patterns:
            conn.send(encode_frame(FrameType.SUB_ADD, "", self._prefix + pattern))
        for raw in self._unconfirmed.raws(origin):
            conn.send(raw)

    async def _handshake_with(self, conn: FrameConnection) -> str:
        """HELLO, the node's challenge, both proofs (:mod:`meshplane.core.mesh.handshake`): the origin
        the node gave this connection."""
        assert self._handshake is not None
        name, nonce = self.name.encode("ascii", "ignore")[:16].decode(), new_nonce()
        hello = Hello(
            PROTOCOL_VERSION,
            name,
            "",
            "client",
            0,
            nonce,
            batched_acks=True,
            origin=self._origin,
            ticket=self._ticket,
            vpn="" if self.vpn == DEFAULT else self.vpn,
        )
        conn.send(encode_frame(FrameType.HELLO, "", payload=encode_payload(hello)))
        answer = self._refusal_or_hello(await self._handshake.get())
        if len(answer.nonce) != NONCE_BYTES:
            raise TransportError(f"the mesh node at {self.url} sent no challenge (an older protocol?)")
        self.node = answer.node
        if (answer.vpn or DEFAULT) != self.vpn:  # a node before VPNs would put us in the default one
            raise TransportError(f"the mesh node at {self.url} knows no Message VPN {self.vpn!r}")
        role = bound_role("client", self.vpn)

        def proof_of(dialler: bool) -> bytes:
            return proof(
                self.secret,
                dialler=dialler,
                dialler_nonce=nonce,
                node_nonce=answer.nonce,
                role=role,
                dialler_id=name,
                node_id=answer.node,
            )

        conn.send(encode_frame(FrameType.AUTH, "", payload=encode_auth(Auth(proof_of(True)))))
        frame = await self._handshake.get()
        if frame is None or frame.type is not FrameType.AUTH:
            self._refusal_or_hello(frame)
            raise TransportError(f"the mesh node at {self.url} answered out of turn")
        try:
            auth = decode_auth(frame.payload)
        except ValueError as exc:
            raise TransportError(f"mesh node {self.url}: {exc}") from None
        if not proof_ok(proof_of(False), auth.proof):
            raise TransportAuthError(
                f"the mesh node at {self.url} could not prove it holds the mesh secret ({SECRET_HINT})"
            )
        keys = session_keys(
            self.secret.encode(),
            dialler_nonce=nonce,
            node_nonce=answer.nonce,
            role=role,
            dialler_id=name,
            node_id=answer.node,
        )
        conn.seal(keys, dialler=True)
        if self.user:  # sealed: the password travels only inside the session
            login = encode_payload(Login(self.user, self._password))
            conn.send(encode_frame(FrameType.LOGIN, "", payload=login))
            answer_frame = await self._handshake.get()
            if answer_frame is None or answer_frame.type is not FrameType.LOGIN:
                raise ConnectionError(f"the mesh node at {self.url} closed the connection at login")
            if answer_frame.payload:
                reason = answer_frame.payload
                raise (
                    LoginBusy
                    if reason.endswith(RETRY_LATER.encode())
                    else WrongCredentials
                    if reason == WRONG.encode()
                    else TransportAuthError
                )(
                    f"the mesh node at {self.url} refused user {self.user!r} in Message VPN {self.vpn!r}: "
                    f"{answer_frame.payload.decode(errors='replace')[:200]}"
                )
        self._ticket = auth.ticket
        return auth.origin

    def _refusal_or_hello(self, frame: Frame | None) -> Hello:
        if frame is None:
            raise ConnectionError(f"the mesh node at {self.url} closed the connection during the handshake")
        if frame.type is not FrameType.HELLO:
            raise TransportError(f"the mesh node at {self.url} answered out of turn")
        try:
            answer = decode_hello(frame.payload)
        except ValueError as exc:
            raise TransportError(f"mesh node {self.url}: {exc}") from None
        if answer.error:
            if "secret" in answer.error:
                raise TransportAuthError(
                    f"the mesh node at {self.url} refused us: {answer.error} ({SECRET_HINT})"
                )
            raise TransportError(f"the mesh node at {self.url} refused us: {answer.error}")
        return answer

    def _protocol(self) -> FrameConnection:
        return FrameConnection(
            max_payload=self.max_payload,
            batch_size=512,
            batch_timeout_ms=0,
            on_frame=self._on_frame,
            on_bad=self._on_bad,
            on_close=self._on_close,
        )

    def _on_bad(self, conn: FrameConnection, error: FrameError) -> None:
        self.bad_frames += 1
        log.warning("dropped a frame from mesh node %s: %s", self.url, error.detail)

    def _on_frame(self, conn: FrameConnection, frame: Frame) -> None:
        if frame.type is FrameType.EVENT:
            subject = frame.subject
            callbacks = self._cache.get(subject)
            if callbacks is None:
                if len(self._cache) >= CACHED_SUBJECTS:  # a subscription to ">" sees any number
                    self._cache.clear()
                callbacks = self._cache[subject] = [
                    self._subs[sid][1] for sid in self._trie.match(outward(self._prefix, subject))
                ]
            if callbacks:
                body = frame.payload[STAMP_BYTES:]
                if self._prefix:
                    subject = outward(self._prefix, subject)
                for callback in callbacks:
                    callback(subject, body)
        elif frame.type is FrameType.ACK:
            if not frame.flags & FLAG_BATCHED_ACKS:
                again = self._unconfirmed.confirm(frame.sequence, frame.payload.decode(errors="replace"))
                if again is not None:  # stored or not, the node cannot say: the same event, a bit later
                    asyncio.get_running_loop().call_later(RESEND_UNKNOWN_SECS, self._resend, frame.sequence)
                return
            try:
                self._unconfirmed.confirm_stored(batched_ack_sequences(frame))
            except ValueError as exc:  # none confirmed: they time out, and are resent on a new connection
                self.bad_frames += 1
                log.warning("dropped a frame from mesh node %s: %s", self.url, exc)
        elif frame.type is FrameType.SYNC_RESP:
            if self._pings:
                ping = self._pings.pop(0)
                if not ping.done():
                    ping.set_result(None)
        elif frame.type is FrameType.HEARTBEAT:
            conn.send(encode_frame(FrameType.HEARTBEAT, ""))  # the node closes idle connections
        elif frame.type in (FrameType.HELLO, FrameType.AUTH, FrameType.LOGIN) and self._handshake is not None:
            self._handshake.put_nowait(frame)
        elif frame.type is FrameType.REFUSED:
            self._refused(frame)

    def _refused(self, frame: Frame) -> None:
        """The node refused a publish or (``sequence`` 0) a subscription of ours: a subscription is
        dropped here too, so it is not made again on the next connection."""
        error = PermissionDenied(frame.payload.decode(errors="replace")[:300])
        if frame.sequence == 0:
            for sid, (pattern, _) in list(self._subs.items()):
                if pattern == frame.subject:
                    self.unsubscribe(sid)
        self.refused.append(error)
        if self.on_error is not None:
            self.on_error(error)

    def _on_close(self, conn: FrameConnection) -> None:
        if self._handshake is not None and conn is not self._conn:
            self._handshake.put_nowait(None)
        if conn is not self._conn:
            return
        self._conn = None
        for ping in self._pings:
            if not ping.done():
                ping.set_exception(TransportError(f"lost the mesh node at {self.url}"))
        self._pings.clear()
        if not self._closing:
            log.warning("lost the mesh node at %s; reconnecting", self.url)
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = 0.05
        refusals = 0  # one per address at least: an HA mate whose users file lags may refuse alone
        while not self._closing and self._conn is None:
            try:
                await self._connect_once(self.timeout)
                log.info("reconnected to the mesh node at %s", self.url)
                return
            except WrongCredentials as exc:
                refusals += 1
                if refusals >= len(self.addresses):
                    self._refused_login = exc
                    log.error("stopped reconnecting to the mesh node at %s: %s", self.url, exc)
                    return
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(2.0, delay * 2)
            except (OSError, TimeoutError, TransportError):
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(2.0, delay * 2)

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.is_open

    async def close(self) -> None:
        self._closing = True
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await asyncio.shield(conn.closed)

    # --- publishing and subscribing ------------------------------------------------------------------

    async def publish(self, subject: str, body: bytes, *, guaranteed: bool = False) -> None:
        """Queue an event for the node (written in batches: at 512 frames, or once the loop is idle);
        waits only while the socket pushes back, so memory stays bounded. With ``guaranteed``, returns
        once the node has stored it (raises TransportError if it refused, or gave no answer within
        the timeout: then it may or may not have been stored)."""
        if guaranteed:
            return await self._publish_guaranteed(subject, body)
        conn = self._conn
        if conn is None:
            self.dropped_disconnected += 1
            return
        conn.send(
            encode_event(
                self._origin, self._prefix + subject, next(self._sequence), time.time_ns() // 1_000_000, body
            )
        )
        if conn.paused:
            await conn.drain()

    def _resend(self, sequence: int) -> None:
        raw = self._unconfirmed.waiting(sequence)
        if raw is not None and self._conn is not None and self._conn.is_open:
            self._conn.send(raw)

    async def _publish_guaranteed(self, subject: str, body: bytes) -> None:
        await (await self.publish_async(subject, body))

    async def publish_async(self, subject: str, body: bytes) -> asyncio.Future[None]:
        """Send a guaranteed event without waiting for its answer (as nats-py's JetStream
        ``publish_async``): waits only while 10,000 are unconfirmed or the socket pushes back, and
        returns a future done once the node stored it, or failed with TransportError (refused, or no
        answer within the timeout: then it may or may not have been stored). Many in flight cost no
        task each."""
        await self._unconfirmed.room()
        sequence = next(self._sequence)
        raw = encode_event(
            self._origin, self._prefix + subject, sequence, time.time_ns() // 1_000_000, body, FLAG_GUARANTEED
        )
        answer = self._unconfirmed.add(sequence, raw, subject, self.timeout)
        conn = self._conn
        if conn is not None:
            conn.send(raw)
            if conn.paused:
                await conn.drain()
        return answer

    async def flush(self, timeout: float | None = None, *, propagated: bool = False) -> None:
        """Wait until the node has handled everything sent so far; with ``propagated``, until every
        node linked to it has too (a subscription made before is then known cluster-wide)."""
        conn = self._conn
        if conn is None:
            raise self._refused_login or TransportError(f"not connected to the mesh node at {self.url}")
        ping: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pings.append(ping)
        conn.send(encode_frame(FrameType.SYNC_REQ, "", flags=FLAG_PROPAGATED if propagated else 0))
        timeout = timeout or self.timeout
        try:
            async with asyncio.timeout(timeout):
                await ping
        except TimeoutError as exc:
            raise TransportError(f"the mesh node at {self.url} did not answer within {timeout}s") from exc
        if self.refused:  # what the node refused before it answered
            first, more = self.refused.popleft(), len(self.refused)
            self.refused.clear()
            raise PermissionDenied(f"{first}" + (f" (and {more} more)" if more else ""))

    def subscribe(self, pattern: str, callback: Callback) -> int:
        sid = next(self._ids)
        self._subs[sid] = (pattern, callback)
        self._trie.insert(pattern, sid)
        self._cache.clear()
        count = self._patterns.get(pattern, 0)
        self._patterns[pattern] = count + 1
        if count == 0 and self._conn is not None:
            self._conn.send(encode_frame(FrameType.SUB_ADD, "", self._prefix + pattern))
        return sid

    def unsubscribe(self, sid: int) -> None:
        entry = self._subs.pop(sid, None)
        if entry is None:
            return
        pattern = entry[0]
        self._trie.remove(pattern, sid)
        self._cache.clear()
        count = self._patterns.pop(pattern) - 1
        if count:
            self._patterns[pattern] = count
        elif self._conn is not None:
            self._conn.send(encode_frame(FrameType.SUB_REMOVE, "", self._prefix + pattern))


MAX_UNCONFIRMED = 10_000  # guaranteed publishes awaiting their ACK, at most
RESEND_UNKNOWN_SECS = 0.5  # a publish answered "unknown" goes again after this (a new connection sooner)
CACHED_SUBJECTS = 4096  # subjects whose subscribers' callbacks are remembered
PASSWORD_ENV = "MESHPLANE_MESH_PASSWORD"  # a VPN user's password (never on argv)
SECRET_HINT = f"set {CLIENT_SECRET_ENV} to the nodes' secret for clients"
