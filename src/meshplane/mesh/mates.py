"""HA mates on separate machines: the active streams its data directory's changes to the standby,
and acknowledges a write only once the standby has it (or once etcd no longer counts the standby).

The standby dials the active's route port (the mesh handshake, role ``mate``: the same node id and
cluster, the mesh secret proven, with TLS a certificate naming the node) and says which mate it is
(MIRROR_ACK 0 carrying its token). The active sends a snapshot (:meth:`DirectorySource.snapshot`)
while it keeps acknowledging alone, then catches up and waits for the standby's answer to a barrier,
then records both mates in etcd's ``current`` (:mod:`.lease`); from then on every acknowledgement
waits for a barrier the standby answered (``Durability.written`` calls :meth:`MirrorServer.barrier`),
rounds shared by every write that waits at once. A standby that does not answer within
``ack_timeout`` is dropped: etcd's ``current`` is set back to the active alone *before* anything
more is acknowledged. The standby applies changes only from the epoch it read in etcd, and takes the
lease when etcd expires the active's (:meth:`Standby.run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import ssl
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
from meshplane.core.mirror import Barrier, Change, Changes, Put, decode_changes, encode_changes
from meshplane.errors import DiscoveryError
from meshplane.mesh.config import parse_route
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.lease import ActiveMate, MateLease
from meshplane.mesh.links import Handshake
from meshplane.mesh.preauth import bounded
from meshplane.mesh.session import session_keys
from meshplane.streams.errors import StorageError
from meshplane.streams.files import write_atomic
from meshplane.streams.mirror import DirectoryReplica, DirectorySource

log = logging.getLogger(__name__)

FRAME_CHANGE_BYTES = 1024 * 1024  # changes per MIRROR frame, about
HEARTBEAT_SECONDS = 1.0  # the standby's MIRROR_ACK 0: keeps the connection from idling out
TOKEN_FILE = ".mate-id"


def mate_token(data_dir: Path) -> str:
    """This mate's name in etcd's ``current``: kept with its data directory, made once."""
    path = data_dir / TOKEN_FILE
    with contextlib.suppress(FileNotFoundError):
        token = path.read_text().strip()
        if token:
            return token
    token = os.urandom(8).hex()
    write_atomic(path, f"{token}\n".encode())  # fsynced: a mate that lost it would never be current
    return token


def mirror_frames(node_id: str, epoch: int, changes: Iterable[Change]) -> Iterable[bytes]:
    """Changes as MIRROR frames of about FRAME_CHANGE_BYTES each."""
    batch: list[Change] = []
    size = 0
    for change in changes:
        batch.append(change)
        size += 64 + (len(change.data) if isinstance(change, Put) else 0)
        if size >= FRAME_CHANGE_BYTES:
            yield encode_frame(FrameType.MIRROR, node_id, "", epoch, encode_changes(Changes(batch)))
            batch, size = [], 0
    if batch:
        yield encode_frame(FrameType.MIRROR, node_id, "", epoch, encode_changes(Changes(batch)))


class StandbyGone(Exception):
    pass


class MirrorServer:
    """The active's side: one standby at a time (a newer connection replaces an older one)."""

    def __init__(
        self,
        node_id: str,
        source: DirectorySource,
        lease: MateLease,
        ack_timeout: float,
        sync_every: float | None,
    ) -> None:
        self.node_id = node_id
        # The standby fsyncs before it answers a barrier: each one (0: --fsync always), or one at least
        # this often (--fsync interval), so its disk is never further behind than the active's.
        self.sync_every = sync_every
        self._synced_at = 0.0
        self.source = source
        self.lease = lease
        self.ack_timeout = ack_timeout
        self.conn: FrameConnection | None = None
        self.state = "absent"  # absent -> syncing (snapshot) -> catching_up -> in_sync
        self.standby = ""  # the standby's token
        self.counters: Counter[str] = Counter()
        self._numbers = itertools.count(1)
        self._acks: dict[int, asyncio.Future[None]] = {}
        self._lock = asyncio.Lock()
        self._requested = self._completed = 0
        self._alone_pending = False  # etcd still names a standby that was dropped
        self._sync: asyncio.Task[None] | None = None
        self._sync_next = False
        self._kicked: asyncio.Task[None] | None = None
        source.on_change = self._kick

    def _kick(self) -> None:
        """A change nobody waits for yet (a topic created, an interval-synced write): sent at once."""
        if self.state in ("catching_up", "in_sync") and (self._kicked is None or self._kicked.done()):
            self._kicked = asyncio.get_running_loop().create_task(self._background_round())

    async def _background_round(self) -> None:
        with contextlib.suppress(StorageError):  # the lease is lost: the step-down says so
            await self.barrier()

    def accept(self, state: Handshake) -> None:
        if self.conn is not None:
            self._drop(self.conn, "a newer standby connection")
        state.role, state.peer, state.conn.peer = "mate", "mate", "mate"
        self.conn = state.conn
        log.info(
            "HA mate: a standby connected from %s",
            state.conn.transport and state.conn.transport.get_extra_info("peername"),
        )

    def on_frame(self, conn: FrameConnection, frame: Frame) -> None:
        if conn is not self.conn or frame.type is not FrameType.MIRROR_ACK:
            self.counters["bad_frames"] += 1
            return
        if frame.sequence == 0:  # hello (with the standby's token) or a heartbeat
            if self.state == "absent" and frame.subject and self._sync is None:
                self.standby = frame.subject
                self._sync = asyncio.create_task(self._snapshot(conn), name="meshplane-mirror-snapshot")
            return
        future = self._acks.pop(frame.sequence, None)
        if future is not None and not future.done():
            future.set_result(None)

    def closed(self, conn: FrameConnection) -> None:
        if conn is self.conn:
            self._drop(conn, "its connection closed")

    def _drop(self, conn: FrameConnection, why: str) -> None:
        if conn is not self.conn:
            return
        if self.state != "absent":
            log.warning("HA mate: standby dropped (%s); acknowledging alone", why)
            self.counters["standby_drops"] += 1
        self._alone_pending = self._alone_pending or self.state == "in_sync"
        self.state, self.conn = "absent", None
        if self._sync is not None:
            self._sync.cancel()
            self._sync = None
        for future in self._acks.values():
            if not future.done():
                future.set_exception(StandbyGone(why))
        self._acks.clear()
        conn.close()

    async def _snapshot(self, conn: FrameConnection) -> None:
        self.state = "syncing"
        self.counters["snapshots"] += 1
        try:
            if self._alone_pending:  # the standby empties its copy first: etcd must not count it then
                async with self._lock:
                    await self._record_alone()
        except StorageError:  # the lease is lost: nothing to mirror from here
            self._drop(conn, "this mate lost its lease")
            return
        for frame in mirror_frames(self.node_id, self.lease.epoch, self.source.snapshot()):
            conn.send(frame)
            self.counters["bytes_sent"] += len(frame)
            await conn.drain()
            if conn is not self.conn:
                return
        self.state = "catching_up"
        self._sync = None
        self._sync_next = True  # the snapshot's files on the standby's disk before it counts
        try:
            await self.barrier()
            if conn is self.conn and self.state == "catching_up":
                await self.lease.set_current([self.lease.token, self.standby])
                self.state = "in_sync"
                log.info("HA mate: the standby is in sync; acknowledgements wait for it")
        except (DiscoveryError, OSError, StorageError) as exc:
            log.warning("HA mate: could not record the standby as in sync (%s)", exc)
            self._drop(conn, str(exc))

    async def barrier(self) -> None:
        """Return once every change made before the call is on the standby (if one is counted), and
        this mate still holds the lease; raises LeaseLost (a 503: retry on the other mate)."""
        self.lease.check()
        self._requested += 1
        ticket = self._requested
        async with self._lock:
            if self._completed < ticket:
                target = self._requested
                await self._round()
                self._completed = target
        self.lease.check()

    async def _round(self) -> None:
        if self._alone_pending:
            await self._record_alone()
        conn = self.conn
        if conn is None or self.state not in ("catching_up", "in_sync"):
            return
        number = next(self._numbers)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks[number] = future
        self.counters["rounds"] += 1
        try:
            async with asyncio.timeout(self.ack_timeout):
                for frame in mirror_frames(self.node_id, self.lease.epoch, self._changes_and(number)):
                    conn.send(frame)
                    self.counters["bytes_sent"] += len(frame)
                    await conn.drain()
                await future
        except (TimeoutError, StandbyGone) as exc:
            self._drop(conn, str(exc) or f"no answer within {self.ack_timeout}s")
            if self._alone_pending:
                await self._record_alone()

    def _changes_and(self, number: int) -> Iterable[Change]:
        yield from self.source.changes()
        now = time.monotonic()
        due = self.sync_every is not None and now - self._synced_at >= self.sync_every
        yield Barrier(number, due or self._sync_next)
        if due or self._sync_next:
            self._synced_at, self._sync_next = now, False

    async def _record_alone(self) -> None:
        """etcd's ``current`` back to this mate alone, before anything more is acknowledged."""
        while True:
            self.lease.check()
            try:
                await self.lease.set_current([self.lease.token])
                self._alone_pending = False
                return
            except DiscoveryError as exc:
                log.warning("HA mate: etcd does not take the standby's drop yet (%s); retrying", exc)
                await asyncio.sleep(0.2)

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "standby": self.standby, "epoch": self.lease.epoch, **self.counters}

    def close(self) -> None:
        if self.conn is not None:
            self._drop(self.conn, "the active is stopping")
        self.source.close()


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
                    line = "the lease is free but etcd does not count this mate as current: waiting"
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
