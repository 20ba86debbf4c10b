"""10,000 guaranteed queues on one real node (issue 60): each PUT acknowledged is kept through SIGKILL,
and the node then refuses one past its bound (``--mesh-max-queues``). The data directory is on tmpfs:
a killed process loses nothing written, synced or not, and two fsyncs per queue on this disk would make
the test minutes long (the bench times queue making on disk)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from meshplane.launchers import StreamsServerProcess
from tests.support.mesh import put_queue, status

COUNT = 10_000


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="meshplane-queues-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
async def test_ten_thousand_queues_made_survive_a_sigkill_and_the_bound_holds(shm_dir: Path) -> None:
    node = StreamsServerProcess(
        data_dir=shm_dir, extra_args=("--node-id", "a", "--route-port", "0", "--mesh-max-queues", str(COUNT))
    )
    with node:
        node.start()
        async with aiohttp.ClientSession() as http:
            names = iter(range(COUNT))

            async def maker() -> None:
                for n in names:
                    await put_queue(node, f"q{n}", [f"queue.{n}.>"], http)

            await asyncio.gather(*(maker() for _ in range(8)))
        node.kill(signal.SIGKILL)  # nothing flushed on the way out: what was acknowledged is on disk
        node.start(timeout=120)
        queues = (await status(node, patterns=False))["guaranteed"]["queues"]
        assert sorted(q["name"] for q in queues) == sorted(f"q{n}" for n in range(COUNT))
        assert {q["name"]: q["patterns"] for q in queues}["q9999"] == ["queue.9999.>"]
        async with aiohttp.ClientSession() as http:
            url = f"{node.url}/mesh/queues/one-more"
            async with http.put(url, json={"patterns": ["x.>"]}) as response:
                assert response.status == 429
                assert f"{COUNT} queues on this node" in await response.text()
            await put_queue(node, "q0", ["changed.>"], http)  # a change of one it has: not a new one
