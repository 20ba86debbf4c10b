"""Mesh nodes seen through their HTTP API: status, interest, queues, and a recording subscriber."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

from meshplane.launchers import StreamsServerProcess
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually


async def status(node: StreamsServerProcess, patterns: bool = True) -> dict[str, Any]:
    """``GET /mesh``, with every link's interest patterns unless ``patterns`` is false."""
    async with aiohttp.ClientSession() as http:
        query = "?patterns=1" if patterns else ""
        async with http.get(f"{node.url}/mesh{query}") as response:
            response.raise_for_status()
            answer: dict[str, Any] = await response.json()
            return answer


async def link(node: StreamsServerProcess, peer: str) -> dict[str, Any]:
    return next(entry for entry in (await status(node))["links"] if entry["peer"] == peer)


async def interest_reached(node: StreamsServerProcess, peer: str, pattern: str, present: bool = True) -> None:
    async def there() -> bool:
        known = (await status(node, patterns=True))["patterns"]["peers"].get(peer, [])
        return (pattern in known) == present

    await eventually(there, timeout=15, interval=0.02, what=f"{pattern} at {peer} known to a node")


class Inbox:
    """A subscriber that records (subject, body) of what it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes]] = []

    def __call__(self, subject: str, body: bytes) -> None:
        self.events.append((subject, body))


async def put_queue(
    node: StreamsServerProcess | str,
    name: str,
    patterns: list[str],
    http: aiohttp.ClientSession | None = None,
) -> dict[str, Any]:
    """A guaranteed queue on ``node`` (or the node at a streams server's HTTP address)."""
    url = _url(node)
    async with (
        _session(http) as session,
        session.put(f"{url}/mesh/queues/{name}", json={"patterns": patterns}) as response,
    ):
        if response.status != 200:
            raise AssertionError(f"PUT queue {name} at {url}: {response.status} {await response.text()}")
        answer: dict[str, Any] = await response.json()
        return answer


async def queue_bodies(
    node: StreamsServerProcess | str, name: str, http: aiohttp.ClientSession | None = None
) -> list[bytes]:
    """Everything the queue's topic holds, in order."""
    url = _url(node)
    bodies: list[bytes] = []
    offset = 0
    async with _session(http) as session:
        while True:
            request = {"from_offset": offset, "limit": 1000}
            async with session.post(f"{url}/topics/{name}/partitions/0/consume", json=request) as response:
                if response.status != 200:
                    raise AssertionError(
                        f"reading queue {name} at {url}: {response.status} {await response.text()}"
                    )
                page = await response.json()
            if not page["events"]:
                return bodies
            bodies.extend(base64.b64decode(event["data"]) for event in page["events"])
            offset = page["next_offset"]


async def publish_all(client: MeshClient, subject: str, bodies: list[bytes]) -> None:
    """Guaranteed publishes, 50 at a time (each returns once stored)."""
    for start in range(0, len(bodies), 50):
        await asyncio.gather(
            *(client.publish(subject, body, guaranteed=True) for body in bodies[start : start + 50])
        )


async def burst_crosses(
    holder_url: str, prober_url: str, seen: Callable[[], Awaitable[dict[str, Any]]], batched: bool, count: int
) -> None:
    """``count`` subscriptions, half of them withdrawn, sent at once (no flush between) by a client of
    one node, reach the node ``prober_url`` names whole: its link to the first (``seen()``: as ``GET
    /mesh`` shows it) counts every change, in a few INTEREST frames when ``batched``, else in none, and
    routes exactly the patterns kept."""
    holder = await MeshClient(holder_url).connect()
    prober = await MeshClient(prober_url).connect()
    inbox = Inbox()
    try:
        subs = [holder.subscribe(f"burst.{i}", inbox) for i in range(count)]
        for i in range(0, count, 2):
            holder.unsubscribe(subs[i])
        await holder.flush()

        async def propagated() -> bool:
            return (await seen()).get("patterns_remote") == count // 2

        await eventually(propagated, timeout=60, interval=0.05, what="the burst's interest there")
        link = await seen()
        assert (link["sub_add_in"], link["sub_remove_in"], link["bad_frames"]) == (count, count // 2, 0)
        if batched:  # a few frames carried them all
            assert 0 < link["interest_frames_in"] <= count // 100
        else:  # one frame per change
            assert link["interest_frames_in"] == 0
        for i in range(count):
            await prober.publish(f"burst.{i}", b"x")
        await prober.flush()
        await eventually(lambda: len(inbox.events) >= count // 2, timeout=60, what="the odd ones' events")
        assert sorted(s for s, _ in inbox.events) == sorted(f"burst.{i}" for i in range(1, count, 2))
    finally:
        for client in (holder, prober):
            await client.close()


@contextlib.asynccontextmanager
async def _session(http: aiohttp.ClientSession | None) -> AsyncIterator[aiohttp.ClientSession]:
    """The caller's session, or one for this call only."""
    if http is not None:
        yield http
    else:
        async with aiohttp.ClientSession() as own:
            yield own


def _url(node: StreamsServerProcess | str) -> str:
    return node if isinstance(node, str) else node.url
