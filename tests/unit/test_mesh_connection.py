"""Batched writes on a mesh connection: at most message_batch_size frames a write, and none waits
longer than message_batch_timeout_ms (0: until the loop is idle). A fake transport records writes."""

from __future__ import annotations

import asyncio

from meshplane.mesh.connection import FrameConnection
from tests.helpers import eventually
from tests.support.transport import RecordingTransport


def connection(batch_size: int, timeout_ms: float) -> tuple[FrameConnection, RecordingTransport]:
    conn = FrameConnection(
        max_payload=1000,
        batch_size=batch_size,
        batch_timeout_ms=timeout_ms,
        on_frame=lambda c, f: None,
        on_bad=lambda c, e: None,
        on_close=lambda c: None,
    )
    transport = RecordingTransport()
    conn.connection_made(transport)
    return conn, transport


async def test_a_full_batch_is_written_at_once_and_the_rest_when_the_loop_is_idle() -> None:
    conn, transport = connection(batch_size=4, timeout_ms=0)
    for i in range(10):
        conn.send(b"%d" % i)
    assert transport.writes == [b"0123", b"4567"]  # two full batches, straight away
    await asyncio.sleep(0)
    assert transport.writes[-1] == b"89"
    assert conn.stats.batches_out == 3
    assert conn.stats.frames_out == 10


async def test_a_partial_batch_waits_for_its_timeout_not_for_the_loop() -> None:
    conn, transport = connection(batch_size=100, timeout_ms=60_000)
    conn.send(b"a")
    conn.send(b"b")
    for _ in range(10):
        await asyncio.sleep(0)
    assert transport.writes == []
    assert conn.buffered_bytes() == 2
    conn.close()  # closing writes what waits
    assert transport.writes == [b"ab"]


async def test_a_partial_batch_is_written_when_its_timeout_passes() -> None:
    conn, transport = connection(batch_size=100, timeout_ms=20)
    conn.send(b"a")
    await eventually(lambda: transport.writes == [b"a"], timeout=5)
    assert conn.buffered_bytes() == 0


class Joined:
    """A batch frame for the test: its items joined, at most three."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    @property
    def full(self) -> bool:
        return len(self.items) >= 3

    def add(self, item: bytes) -> None:
        self.items.append(item)

    def encode(self) -> bytes:
        return b"[" + b"".join(self.items) + b"]"


async def test_batched_items_keep_their_place_among_other_frames() -> None:
    conn, transport = connection(batch_size=100, timeout_ms=0)
    for item in (b"a", b"b"):
        conn.send_batched(item, Joined)
    conn.send(b"X")  # closes the batch: what came before it stays before it
    for item in (b"c", b"d", b"e", b"f"):  # three fill a batch: the fourth begins the next
        conn.send_batched(item, Joined)
    await asyncio.sleep(0)
    assert transport.writes == [b"[ab]X[cde][f]"]
    conn.send_batched(b"g", Joined)
    conn.close()  # closing writes the batch being filled too
    assert transport.writes[-1] == b"[g]"
