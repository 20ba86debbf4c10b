"""A cancelled consumer stops, even when its event arrives in the same instant.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the caller is cancelled just as that
result arrives, and the cancellation is lost: a consumer loop then waits on (``meshplane up`` hung on
Ctrl-C that way, in ``_consume`` behind a JetStream publish). ``asyncio.timeout`` keeps it.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from meshplane import EventPlane, Scope
from meshplane.config import PlaneConfig

SCOPE = Scope.endpoint("cancel", "worker", "generate")
SOURCE = Path(__file__).resolve().parents[2] / "src" / "meshplane"


async def test_next_with_a_timeout_honours_a_cancel_that_meets_an_arriving_event() -> None:
    config = PlaneConfig(event_plane="mem", discovery_backend="mem")
    async with EventPlane(config) as plane:
        subscriber = await plane.subscriber(SCOPE, "race")
        publisher = await plane.publisher(SCOPE, "race")

        async def consume() -> int:
            received = 0
            while True:  # a consumer loop: it only ends by cancellation
                await subscriber.next(timeout=30)
                received += 1

        consumer = asyncio.create_task(consume())
        for _ in range(5):
            await asyncio.sleep(0)  # the consumer is waiting inside next()
        await publisher.publish(b"arrives")  # delivered in this step (the in-process bus)...
        consumer.cancel()  # ...and cancelled in the same one
        done, _ = await asyncio.wait({consumer}, timeout=5)
        assert done, "the consumer went on waiting: its cancellation was lost"
        assert consumer.cancelled()


def test_no_asyncio_wait_for_in_the_package() -> None:
    """The rule behind the test above, for every await in the package: ``asyncio.timeout`` instead."""
    offenders = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr == "wait_for"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                offenders.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    assert offenders == [], "asyncio.wait_for loses a cancellation on Python 3.11: " + ", ".join(offenders)


@pytest.mark.parametrize("delay", [0.0, 0.01])
async def test_a_timeout_still_times_out(delay: float) -> None:
    config = PlaneConfig(event_plane="mem", discovery_backend="mem")
    async with EventPlane(config) as plane:
        subscriber = await plane.subscriber(SCOPE, "quiet")
        with pytest.raises(TimeoutError):
            await subscriber.next(timeout=delay)
