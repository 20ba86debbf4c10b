"""The active mate's MirrorServer with a real etcd and a standby on a real socket (issue 53, item 1):
the standby closes while the active's etcd write naming it is in flight (etcd paused with SIGSTOP,
as the issue's reproduction did), and the active must not acknowledge anything alone until etcd's
``current`` names it alone again; a standby that comes back gets a new snapshot."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

from meshplane.core.mesh.frames import Frame, FrameType, encode_frame
from meshplane.core.mirror import Barrier, Reset, decode_changes
from meshplane.launchers.etcd import EtcdServer
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.lease import MateLease
from meshplane.mesh.links import Handshake
from meshplane.mesh.mates import MirrorServer
from meshplane.mesh.session import session_keys
from meshplane.streams.mirror import DirectorySource
from tests.helpers import eventually

# Both ends sealed as after a real handshake (every frame after AUTH travels in the session's records).
KEYS = session_keys(
    b"mates' secret", dialler_nonce=b"d" * 16, node_nonce=b"n" * 16, role="mate", dialler_id="a", node_id="a"
)


def _seal_and(conn: FrameConnection, dialler: bool, then: Callable[[FrameConnection], None]) -> None:
    conn.seal(KEYS, dialler=dialler)
    then(conn)


class FakeStandby:
    """A standby that answers every barrier (after ``on_barrier``) and records what it got."""

    def __init__(self, token: str, on_barrier: Callable[[], None] = lambda: None) -> None:
        self.token = token
        self.on_barrier = on_barrier
        self.resets = 0
        self.barriers = 0
        self.conn: FrameConnection | None = None

    def protocol(self) -> FrameConnection:
        self.conn = FrameConnection(
            max_payload=1 << 24,
            batch_size=64,
            batch_timeout_ms=0,
            on_frame=self._frame,
            on_bad=lambda conn, error: conn.close(),
            on_close=lambda conn: None,
            on_open=lambda conn: _seal_and(
                conn, True, lambda c: c.send(encode_frame(FrameType.MIRROR_ACK, "a", self.token, 0))
            ),
        )
        return self.conn

    def _frame(self, conn: FrameConnection, frame: Frame) -> None:
        for change in decode_changes(frame.payload).changes:
            if isinstance(change, Reset):
                self.resets += 1
            elif isinstance(change, Barrier):
                self.barriers += 1
                self.on_barrier()
                conn.send(encode_frame(FrameType.MIRROR_ACK, "a", self.token, change.number))


async def test_barrier_never_returns_alone_while_etcd_names_a_standby_that_closed_during_its_write(
    tmp_path: Path, etcd_server: EtcdServer
) -> None:
    lease = MateLease((etcd_server.endpoint,), f"m{os.urandom(4).hex()}", "a", "a1")
    assert await lease.acquire()
    data = tmp_path / "a1"
    data.mkdir()
    mirror = MirrorServer("a", DirectorySource(data), lease, ack_timeout=2.0, sync_every=0.0)
    loop = asyncio.get_running_loop()

    def active_side() -> FrameConnection:
        return FrameConnection(
            max_payload=1 << 24,
            batch_size=64,
            batch_timeout_ms=0,
            on_frame=mirror.on_frame,
            on_bad=lambda conn, error: conn.close(),
            on_close=mirror.closed,
            on_open=lambda conn: _seal_and(conn, False, lambda c: mirror.accept(Handshake(c, dialed=False))),
        )

    server = await loop.create_server(active_side, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    etcd = etcd_server.pid
    paused = asyncio.Event()

    def pause_etcd() -> None:
        """The catch-up barrier is answered: the active's write of current=[a1, s1] will hang."""
        if not paused.is_set():
            os.kill(etcd, signal.SIGSTOP)
            paused.set()

    standby = FakeStandby("s1", on_barrier=pause_etcd)
    try:
        await loop.create_connection(standby.protocol, "127.0.0.1", port)
        await eventually(paused.is_set, what="the standby answered its catch-up barrier")
        assert standby.resets == 1  # it got a snapshot
        assert standby.conn is not None
        standby.conn.close()  # gone while etcd takes it in
        await eventually(lambda: mirror.conn is None, what="the active saw the standby go")
        (data / "x").write_bytes(b"a write to acknowledge")
        answered = asyncio.create_task(mirror.barrier())
        await asyncio.sleep(0.3)
        assert not answered.done(), "acknowledged alone while etcd may name the standby that left"
    finally:
        os.kill(etcd, signal.SIGCONT)
    try:
        await asyncio.wait_for(answered, 20)
        assert (await lease.current())[0] == ["a1"], "acknowledged while etcd names a gone standby"

        # The standby comes back: a new snapshot, then it is named again and barriers wait for it.
        back = FakeStandby("s1")
        await loop.create_connection(back.protocol, "127.0.0.1", port)
        await eventually(lambda: mirror.state == "in_sync", timeout=20, what="the standby back in sync")
        assert back.resets == 1
        assert (await lease.current())[0] == ["a1", "s1"]
        before = back.barriers
        await asyncio.wait_for(mirror.barrier(), 10)
        assert back.barriers > before
    finally:
        mirror.close()
        server.close()
        await lease.close()
