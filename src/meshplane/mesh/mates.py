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
lease when etcd expires the active's (:mod:`.standby`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any

from meshplane.core.mesh.frames import (
    Frame,
    FrameType,
    encode_frame,
)
from meshplane.core.mesh.mirror_membership import (
    Answer,
    Fail,
    MirrorMembership,
    SendRound,
    StartSnapshot,
)
from meshplane.core.mirror import Barrier, Change, Changes, Put, encode_changes
from meshplane.errors import DiscoveryError
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.lease import LeaseLost, MateLease
from meshplane.mesh.links import Handshake
from meshplane.streams.errors import StorageError
from meshplane.streams.files import write_atomic
from meshplane.streams.mirror import DirectorySource

log = logging.getLogger(__name__)

FRAME_CHANGE_BYTES = 1024 * 1024  # changes per MIRROR frame, about
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


class MirrorServer:
    """The active's side, the thin adapter of :class:`MirrorMembership`: one standby connection at a
    time (a newer one replaces an older one); the membership decides what to send, what to write to
    etcd and which acknowledgement to answer, this class does it and tells it what happened."""

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
        self.membership = MirrorMembership(lease.token)
        self.conn: FrameConnection | None = None
        self._gens: dict[FrameConnection, int] = {}
        self.counters: Counter[str] = Counter()
        self._tickets: dict[int, asyncio.Future[None]] = {}
        self._answers: dict[int, asyncio.Future[None]] = {}  # round number: the standby answered
        self._tasks: set[asyncio.Task[None]] = set()
        self._sync_next = False
        self._kicked: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        source.on_change = self._kick

    @property
    def state(self) -> str:
        return self.membership.state()

    @property
    def standby(self) -> str:
        return self.membership.standby

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
        gen = self._gens.get(conn)
        if frame.sequence == 0:  # hello (with the standby's token) or a heartbeat
            if gen is None and frame.subject:
                self._gens[conn] = self.membership.connected(frame.subject)
                self._act()
            return
        answer = self._answers.get(frame.sequence)
        if gen is not None and answer is not None and not answer.done():
            answer.set_result(None)

    def closed(self, conn: FrameConnection) -> None:
        if conn is self.conn:
            self._drop(conn, "its connection closed")

    def _drop(self, conn: FrameConnection, why: str) -> None:
        if conn is not self.conn:
            return
        if self.state != "absent":
            log.warning("HA mate: standby dropped (%s); etcd counts it no more before the next answer", why)
            self.counters["standby_drops"] += 1
        self.conn = None
        gen = self._gens.pop(conn, None)
        conn.close()
        if gen is not None:
            self.membership.closed(gen)
            self._act()

    # --- carrying out the membership's decisions -------------------------------------------------------

    def _act(self) -> None:
        for action in self.membership.actions():
            if isinstance(action, Answer | Fail):
                self._answer(action)
            elif isinstance(action, StartSnapshot):
                self._spawn(self._snapshot(action.gen), "meshplane-mirror-snapshot")
            elif isinstance(action, SendRound):
                self._spawn(self._round(action.gen, action.number), "meshplane-mirror-round")
            else:
                self._spawn(self._write_current(action.tokens), "meshplane-mirror-current")

    def _answer(self, action: Answer | Fail) -> None:
        if isinstance(action, Answer) and not self.lease.valid():
            self.membership.lease_lost()  # the lease ran out meanwhile: nothing is answered now
            self._act()
            return
        future = self._tickets.pop(action.ticket, None)
        if future is None or future.done():
            return
        if isinstance(action, Answer):
            future.set_result(None)
        else:
            future.set_exception(
                LeaseLost(f"{action.reason} (epoch {self.lease.epoch}); retry on the other mate")
            )

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _conn_of(self, gen: int) -> FrameConnection | None:
        conn = self.conn
        return conn if conn is not None and self._gens.get(conn) == gen else None

    async def _send(self, conn: FrameConnection, frames: Iterable[bytes]) -> None:
        for frame in frames:
            conn.send(frame)
            self.counters["bytes_sent"] += len(frame)
            await conn.drain()

    async def _snapshot(self, gen: int) -> None:
        conn = self._conn_of(gen)
        if conn is None:
            return
        self.counters["snapshots"] += 1
        try:
            await self._send(conn, mirror_frames(self.node_id, self.lease.epoch, self.source.snapshot()))
        except (OSError, StorageError) as exc:  # it starts over on a new connection
            log.warning("HA mate: could not send the standby its snapshot (%s)", exc)
            self._drop(conn, str(exc))
            return
        if self._conn_of(gen) is conn:
            self._sync_next = True  # the snapshot's files on the standby's disk before it counts
            self.membership.snapshot_sent(gen)
            self._act()

    async def _round(self, gen: int, number: int) -> None:
        conn = self._conn_of(gen)
        if conn is None:
            return
        answered = asyncio.get_running_loop().create_future()
        self._answers[number] = answered
        self.counters["rounds"] += 1
        try:
            async with asyncio.timeout(self.ack_timeout):
                await self._send(
                    conn, mirror_frames(self.node_id, self.lease.epoch, self._changes_and(number))
                )
                await answered
        except TimeoutError:
            self._drop(conn, f"no answer within {self.ack_timeout}s")
            return
        finally:
            del self._answers[number]
        self.membership.answered(gen, number)
        self._act()

    async def _write_current(self, tokens: tuple[str, ...]) -> None:
        ok = False
        try:
            self.lease.check()
            await self.lease.set_current(list(tokens))
            ok = True
        except LeaseLost as exc:
            self.membership.lease_lost(str(exc))
        except DiscoveryError as exc:
            log.warning("HA mate: etcd did not take current=%s (%s); trying again", list(tokens), exc)
            await asyncio.sleep(0.2)
        else:
            if len(tokens) > 1:
                log.info("HA mate: the standby is in sync; acknowledgements wait for it")
        self.membership.written(ok)
        self._act()

    async def barrier(self) -> None:
        """Return once every change made before the call is on every mate etcd's ``current`` may
        name, and this mate still holds the lease; raises LeaseLost (a 503) otherwise."""
        self.lease.check()
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_lease())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tickets[self.membership.request()] = future
        self._act()
        await future

    async def _watch_lease(self) -> None:
        await self.lease.lost.wait()
        self.membership.lease_lost()
        self._act()

    def _changes_and(self, number: int) -> Iterable[Change]:
        yield from self.source.changes()
        now = time.monotonic()
        due = self.sync_every is not None and now - self._synced_at >= self.sync_every
        yield Barrier(number, due or self._sync_next)
        if due or self._sync_next:
            self._synced_at, self._sync_next = now, False

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "standby": self.standby, "epoch": self.lease.epoch, **self.counters}

    def close(self) -> None:
        if self.conn is not None:
            self._drop(self.conn, "the active is stopping")
        self.membership.lease_lost("this HA mate is stopping")
        self._act()
        for task in (*self._tasks, self._watch):
            if task is not None:
                task.cancel()
        self.source.close()
