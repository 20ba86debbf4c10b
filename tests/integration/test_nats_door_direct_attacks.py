"""The NATS door's direct path against what changes under a learnt route: a subject bound to a
guaranteed queue after its route was learnt (here, on a peer) is a guaranteed event from then on
(stored before flush() returns), never a plain direct event."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import nats
import pytest

from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.integration.test_nats_door import NatsMesh
from tests.support.mesh import Inbox, interest_reached, put_queue, queue_bodies


@pytest.fixture(scope="module")
def mesh() -> Iterator[NatsMesh]:
    with NatsMesh(2) as doors:
        yield doors


def _counters(mesh: NatsMesh, node: str) -> dict[str, Any]:
    with urllib.request.urlopen(mesh[node].url + "/mesh", timeout=10) as answer:
        found: dict[str, Any] = json.load(answer)
    return found


def _direct_events(mesh: NatsMesh, node: str) -> int:
    return int(_counters(mesh, node)["counters"]["direct_path_events"])


def _stored(mesh: NatsMesh, node: str) -> int:
    return int(_counters(mesh, node)["nats"]["counters"].get("guaranteed_stored", 0))


@pytest.mark.parametrize("where", ["a", "b"])
async def test_a_subject_bound_to_a_queue_after_its_route_was_learnt_is_stored_before_flush(
    mesh: NatsMesh, where: str
) -> None:
    subject, queue = f"late-{where}.x", f"late-{where}"
    watcher = await MeshClient(mesh["b"].route_url).connect()
    seen = Inbox()
    watcher.subscribe(subject, seen)
    await watcher.flush()
    await interest_reached(mesh["a"], "b", subject)
    publisher = await nats.connect(mesh.url("a"))
    try:
        before = await asyncio.to_thread(_direct_events, mesh, "a")
        for i in range(200):
            await publisher.publish(subject, b"plain-%d" % i)
        await publisher.flush()
        await eventually(lambda: len(seen.events) == 200, timeout=30, what="the plain events")
        assert await asyncio.to_thread(_direct_events, mesh, "a") > before  # the route was learnt

        await put_queue(mesh[where], queue, [subject])
        if where == "b":
            await interest_reached(mesh["a"], "b", "$G." + subject)
        stored = await asyncio.to_thread(_stored, mesh, "a")
        bodies = [b"kept-%d" % i for i in range(50)]
        for body in bodies:
            await publisher.publish(subject, body)
        await publisher.flush()  # its PONG waits until every one of them is stored
        assert await asyncio.to_thread(_stored, mesh, "a") - stored == len(bodies)

        async def kept() -> bool:
            return len(await queue_bodies(mesh[where], queue)) >= len(bodies)

        await eventually(kept, timeout=30, what="the queue holds them all")
        assert await queue_bodies(mesh[where], queue) == bodies
    finally:
        await publisher.close()
        await watcher.close()
