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
    STAMP_BYTES,
    Frame,
    FrameError,
    FrameType,
    batched_ack_sequences,
    encode_event,
    encode_frame,
)
from meshplane.core.mesh.login_checks import LOGIN_FIRST
from meshplane.core.mesh.vpn import DEFAULT, check_vpn, outward, prefix_of
from meshplane.core.subjects import PatternIndex
from meshplane.errors import (
    LoginBusy,
    PermissionDenied,
    TransportAuthError,
    TransportError,
    WrongCredentials,
)
from meshplane.mesh.client_handshake import greet
from meshplane.mesh.config import CLIENT_SECRET_ENV, parse_node_urls, secret_from_env
from meshplane.mesh.connection import FrameConnection
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
        keepalive: float = 30.0,
    ) -> None:
        """``vpn``: the Message VPN to publish and subscribe in (the node must have it); ``user``: log
        in to it as this user, with ``password`` (default: ``$MESHPLANE_MESH_PASSWORD``; never argv).
        What the user's permissions refuse is given to ``on_error`` and raised by the next ``flush``.
        A node silent for ``keepalive`` seconds is asked to answer; silent twice as long, it is taken
        for lost (a frozen process or a partition keeps TCP open) and the client reconnects."""
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
        # subject as it came -> (as its callbacks see it, its callbacks)
        self._cache: dict[str, tuple[str, list[Callback]]] = {}
        self._ids = itertools.count(1)
        self._sequence = itertools.count(1)
        self._closing = False
        self._reconnect: asyncio.Task[None] | None = None
        self._ticket = b""  # the node's, to keep ``_origin`` on the next connection
        self._unconfirmed = Unconfirmed(MAX_UNCONFIRMED, self.url)
        self._refused_login: TransportAuthError | None = None  # why it stopped reconnecting
        self._session_refused: TransportAuthError | None = None  # why the node is closing this session
        self._sessions_refused = 0  # in a row: each address refused a session without a login
        self.keepalive = keepalive
        self._watch: asyncio.Task[None] | None = None

    # --- connection ----------------------------------------------------------------------------------

    async def connect(self) -> MeshClient:
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            try:
                await self._connect_once(max(0.1, deadline - time.monotonic()))
                if self._watch is None:
                    self._watch = asyncio.get_running_loop().create_task(self._watch_node())
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
        assert self._handshake is not None
        session = await greet(
            conn,
            self._handshake,
            url=self.url,
            name=self.name,
            secret=self.secret,
            vpn=self.vpn,
            origin=self._origin,
            ticket=self._ticket,
            user=self.user,
            password=self._password,
        )
        self.node, self._ticket = session.node, session.ticket
        return session.origin

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
            cached = self._cache.get(frame.subject)
            if cached is None:
                if len(self._cache) >= CACHED_SUBJECTS:  # a subscription to ">" sees any number
                    self._cache.clear()
                external = outward(self._prefix, frame.subject)  # its VPN's prefix off, once a subject
                cached = self._cache[frame.subject] = (
                    external,
                    [self._subs[sid][1] for sid in self._trie.match(external)],
                )
            subject, callbacks = cached
            if callbacks:
                body = frame.payload[STAMP_BYTES:]
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
        elif frame.type is FrameType.LOGIN and frame.payload:  # a session the VPN takes only logged in
            reason = frame.payload.decode(errors="replace")[:200]
            error = TransportAuthError(f"the mesh node at {self.url} refused us: {reason}")
            if reason.startswith(LOGIN_FIRST):  # else a limit: dialled again, as room may come
                self._session_refused = error
            else:
                log.warning("%s", error)
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
        refused, self._session_refused = self._session_refused, None
        for ping in self._pings:  # a refused session's flush is told why
            if not ping.done():
                ping.set_exception(refused or TransportError(f"lost the mesh node at {self.url}"))
        self._pings.clear()
        self._sessions_refused = self._sessions_refused + 1 if refused is not None else 0
        if refused is not None and self._sessions_refused >= len(self.addresses):
            # Dialling again would be refused again, at once and for ever: the application is told.
            self._refused_login = refused
            log.error("stopped reconnecting to the mesh node at %s: %s", self.url, refused)
        elif not self._closing:
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

    async def _watch_node(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.keepalive / 2)
            conn = self._conn
            silent = time.monotonic() - conn.last_received if conn is not None else 0.0
            if conn is None or silent <= self.keepalive:
                continue
            if silent > 2 * self.keepalive:
                log.warning("the mesh node at %s has been silent for %.1fs; reconnecting", self.url, silent)
                conn.limit("silent")
            else:  # answered like a flush's (in order); an answer nobody waits for is dropped
                probe: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                probe.add_done_callback(lambda done: done.exception())
                self._pings.append(probe)
                conn.send(encode_frame(FrameType.SYNC_REQ, ""))

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.is_open

    async def close(self) -> None:
        self._closing = True
        for task in (self._reconnect, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
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
            if self._refused_login is not None:  # raised afresh: each raise would add its frames to it
                raise self._refused_login.with_traceback(None)
            raise TransportError(f"not connected to the mesh node at {self.url}")
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
