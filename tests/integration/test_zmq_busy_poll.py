"""A busy-polling ZeroMQ subscriber (``MESHPLANE_BUSY_POLL``) spins instead of sleeping, but never
holds its event loop: the loop's other tasks keep their turns, and closing ends the spin.

The contract suite runs against it too (``zmq-busypoll`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from meshplane import ClosedError, EventPlane, PlaneConfig, Scope


def config(tmp_path: Path, busy_poll: float) -> PlaneConfig:
    return PlaneConfig.from_env(
        {},
        event_plane="zmq",
        discovery_backend="file",
        file_kv=tmp_path / "kv",
        file_kv_poll_interval=0.02,
        busy_poll=busy_poll,
    )


async def test_the_loop_s_other_tasks_keep_their_turns_while_a_subscriber_spins(tmp_path: Path) -> None:
    scope = Scope.namespace(f"busy-{uuid.uuid4().hex[:8]}")
    async with EventPlane(config(tmp_path, busy_poll=1.0)) as plane:
        sub = await plane.subscriber(scope, "kv")
        pub = await plane.publisher(scope, "kv")
        await pub.wait_for_subscribers(1, timeout=10)
        waiting = asyncio.create_task(sub.next(timeout=30))
        gaps: list[float] = []
        cpu, started = time.process_time(), time.monotonic()
        last = started
        while last - started < 0.5:  # the subscriber spins all this time
            await asyncio.sleep(0)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        spun = time.process_time() - cpu
        assert not waiting.done()
        # A spin that held the loop would leave one gap of the whole busy-poll second; turns come every
        # millisecond (half a second leaves a loaded machine room and still catches the hold).
        assert max(gaps) < 0.5, f"the loop was held for {max(gaps):.3f} s"
        assert spun > 0.1, f"the subscriber did not spin ({spun:.3f} s of CPU in 0.5 s)"
        await pub.publish(b"during the spin")
        assert (await waiting).payload == b"during the spin"


async def test_closing_ends_a_spin(tmp_path: Path) -> None:
    scope = Scope.namespace(f"busy-{uuid.uuid4().hex[:8]}")
    async with EventPlane(config(tmp_path, busy_poll=1.0)) as plane:
        sub = await plane.subscriber(scope, "kv")
        waiting = asyncio.create_task(sub.next(timeout=30))
        await asyncio.sleep(0.05)  # into the spin
        await sub.close()
        with pytest.raises(ClosedError):
            await asyncio.wait_for(waiting, timeout=0.5)  # before the spin's second is over
