"""The NATS door on the node's direct path (``_nats.c`` route_pubs on the publisher's node, MSG lines
rendered by ``route_events`` on the subscriber's): what it takes comes out as the Python path's would,
and a route it learnt is forgotten when a client's subscriptions change (a new sid on a subject the
node already wants, an ``UNSUB max``), so no event goes to a sid that is gone or misses a new one."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import nats
import pytest

from meshplane.core.doors.nats_protocol import Err, Msg, NatsParser, Op, Pong, unwrap
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.integration.test_nats_door import NatsMesh, Received
from tests.support.mesh import Inbox, interest_reached, put_queue, queue_bodies, status


@pytest.fixture(scope="module")
def mesh() -> Iterator[NatsMesh]:
    with NatsMesh(2) as doors:
        yield doors


def counters(mesh: NatsMesh, node: str) -> dict[str, Any]:
    with urllib.request.urlopen(mesh[node].url + "/mesh", timeout=10) as answer:
        found: dict[str, Any] = json.load(answer)["counters"]
    return found


async def direct_events(mesh: NatsMesh, node: str) -> int:
    found: int = (await asyncio.to_thread(counters, mesh, node))["direct_path_events"]
    return found


async def test_events_through_the_direct_path_arrive_whole_and_in_order(mesh: NatsMesh) -> None:
    pub, sub = await nats.connect(mesh.url("a")), await nats.connect(mesh.url("b"))
    got = Received()
    try:
        await sub.subscribe("direct.order", cb=got.cb)
        await sub.flush()
        await interest_reached(mesh["a"], "b", "direct.order")
        before = {node: await direct_events(mesh, node) for node in "ab"}
        payloads = [bytes([i % 256]) * (i % 300) + b"\r\nMSG x 1 2\r\n" for i in range(3000)]
        for payload in payloads:
            await pub.publish("direct.order", payload)
        await pub.flush()
        await eventually(lambda: len(got.msgs) >= len(payloads), timeout=30, what="every event at b")
        assert [m.data for m in got.msgs] == payloads
        assert {m.subject for m in got.msgs} == {"direct.order"}
        for node in "ab":  # both nodes took most of them in C
            assert await direct_events(mesh, node) - before[node] > len(payloads) // 2, node
    finally:
        await pub.close()
        await sub.close()


async def test_a_new_sid_on_a_subject_already_routed_gets_the_events(mesh: NatsMesh) -> None:
    pub, sub = await nats.connect(mesh.url("a")), await nats.connect(mesh.url("b"))
    first, second = Received(), Received()
    try:
        await sub.subscribe("direct.sids", cb=first.cb)
        await sub.flush()
        await interest_reached(mesh["a"], "b", "direct.sids")
        for _ in range(200):  # the route is learnt on both nodes
            await pub.publish("direct.sids", b"before")
        await pub.flush()
        await eventually(lambda: len(first.msgs) >= 200, what="the first sid's events")
        await sub.subscribe("direct.sids", cb=second.cb)  # the node's interest does not change
        await sub.flush()
        for _ in range(200):
            await pub.publish("direct.sids", b"after")
        await pub.flush()
        await eventually(lambda: len(second.msgs) >= 200, what="the second sid's events")
        assert len(first.msgs) == 400
        assert {m.data for m in second.msgs} == {b"after"}
    finally:
        await pub.close()
        await sub.close()


class RawClient:
    """A NATS connection read with the codec itself (nats-py drops MSGs past an UNSUB max on its own)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = NatsParser()
        self.ops: list[Op] = []

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        await client.until(lambda: bool(client.ops))  # INFO
        return client

    async def until(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self.ops += self.parser.feed(await self.reader.read(65536))

    async def ping(self, data: bytes = b"") -> None:
        """``data``, then a PING; returns once its PONG came (and every MSG written before it)."""
        pongs = sum(isinstance(op, Pong) for op in self.ops)
        self.writer.write(data + b"PING\r\n")
        await self.until(lambda: sum(isinstance(op, Pong) for op in self.ops) > pongs)

    def msgs(self) -> list[Msg]:
        return [op for op in self.ops if isinstance(op, Msg)]


async def test_unsub_max_after_the_route_is_learnt_stops_at_max(mesh: NatsMesh) -> None:
    pub, stays = await nats.connect(mesh.url("a")), await nats.connect(mesh.url("b"))
    raw = await RawClient.connect(mesh.port("b"))
    witness = Received()
    try:
        await raw.ping(b"CONNECT {}\r\nSUB direct.max 1\r\n")
        await stays.subscribe("direct.max", cb=witness.cb)  # another client's, which stays
        await stays.flush()
        await interest_reached(mesh["a"], "b", "direct.max")
        for _ in range(100):
            await pub.publish("direct.max", b"x")
        await pub.flush()
        await raw.until(lambda: len(raw.msgs()) >= 100)
        await raw.ping(b"UNSUB 1 130\r\n")  # 30 more
        for _ in range(300):
            await pub.publish("direct.max", b"y")
        await pub.flush()
        await eventually(lambda: len(witness.msgs) >= 400, what="every event at the client that stays")
        await raw.ping()
        assert len(raw.msgs()) == 130
    finally:
        await pub.close()
        await stays.close()
        raw.writer.close()


async def test_a_client_without_echo_never_gets_its_own_events(mesh: NatsMesh) -> None:
    quiet = await nats.connect(mesh.url("a"), no_echo=True)
    other = await nats.connect(mesh.url("b"))
    own, elsewhere = Received(), Received()
    try:
        await quiet.subscribe("direct.echo", cb=own.cb)
        await other.subscribe("direct.echo", cb=elsewhere.cb)
        await quiet.flush()
        await other.flush()
        await interest_reached(mesh["a"], "b", "direct.echo")
        for _ in range(500):
            await quiet.publish("direct.echo", b"mine")
        await quiet.flush()
        await eventually(lambda: len(elsewhere.msgs) >= 500, what="the events at b")
        await quiet.flush()
        assert own.msgs == []
    finally:
        await quiet.close()
        await other.close()


@pytest.mark.parametrize(
    "broken",
    [
        b"PUB direct.broken 2\r\nbroken\r\n",
        # refused as nats-server refuses it: the client's CONNECT did not say ``headers``
        b"HPUB direct.broken 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
    ],
    ids=["a wrong size", "an HPUB without headers in CONNECT"],
)
async def test_publishes_before_a_broken_operation_in_the_same_read_are_delivered(
    mesh: NatsMesh, broken: bytes
) -> None:
    sub = await nats.connect(mesh.url("b"))
    raw = await RawClient.connect(mesh.port("a"))
    got = Received()
    try:
        await sub.subscribe("direct.broken", cb=got.cb)
        await sub.flush()
        await interest_reached(mesh["a"], "b", "direct.broken")
        await raw.ping(b"CONNECT {}\r\nPUB direct.broken 5\r\nfirst\r\n")  # the route is learnt
        raw.writer.write(b"PUB direct.broken 6\r\nsecond\r\n" + broken)
        await raw.until(lambda: any(isinstance(op, Err) for op in raw.ops))
        await eventually(lambda: len(got.msgs) >= 2, what="both events before the broken one")
        await sub.flush()
        assert [m.data for m in got.msgs] == [b"first", b"second"]
        assert next(op for op in raw.ops if isinstance(op, Err)).message == "Unknown Protocol Operation"
    finally:
        await sub.close()
        raw.writer.close()


async def _stored(mesh: NatsMesh, node: str) -> int:
    return int((await status(mesh[node], patterns=False))["nats"]["counters"].get("guaranteed_stored", 0))


@pytest.mark.parametrize("where", ["a", "b"])
async def test_a_subject_bound_to_a_queue_after_its_route_was_learnt_is_stored_before_flush(
    mesh: NatsMesh, where: str
) -> None:
    """A PUB on a subject bound to a queue (here or on a peer) after the direct path learnt its route
    is a guaranteed event from then on: stored before flush() returns, never a plain direct event."""
    subject, queue = f"late-{where}.x", f"late-{where}"
    watcher = await MeshClient(mesh["b"].route_url).connect()
    seen = Inbox()
    watcher.subscribe(subject, seen)
    await watcher.flush()
    await interest_reached(mesh["a"], "b", subject)
    publisher = await nats.connect(mesh.url("a"))
    try:
        before = await direct_events(mesh, "a")
        for i in range(200):
            await publisher.publish(subject, b"plain-%d" % i)
        await publisher.flush()
        await eventually(lambda: len(seen.events) == 200, timeout=30, what="the plain events")
        assert await direct_events(mesh, "a") > before  # the route was learnt

        await put_queue(mesh[where], queue, [subject])
        if where == "b":
            await interest_reached(mesh["a"], "b", "$G." + subject)
        stored = await _stored(mesh, "a")
        bodies = [b"kept-%d" % i for i in range(50)]
        for body in bodies:
            await publisher.publish(subject, body)
        await publisher.flush()  # its PONG waits until every one of them is stored
        assert await _stored(mesh, "a") - stored == len(bodies)

        async def kept() -> bool:
            return len(await queue_bodies(mesh[where], queue)) >= len(bodies)

        await eventually(kept, timeout=30, what="the queue holds them all")
        assert await queue_bodies(mesh[where], queue) == bodies
    finally:
        await publisher.close()
        await watcher.close()


async def test_pubs_and_hpubs_in_c_and_requests_in_python_keep_their_publishers_order(mesh: NatsMesh) -> None:
    """One publisher's PUBs on one subject, every third with a reply subject (an envelope: the Python
    path), every third with headers (an envelope too, made in C once the route is learnt) and the rest
    plain (the C path), arrive in the order they were published, on its node (a mesh client, which gets
    the envelopes) and across the route (a NATS client, with their headers)."""
    pub, far = await nats.connect(mesh.url("a")), await nats.connect(mesh.url("b"))
    near, inbox = MeshClient(mesh["a"].route_url), Inbox()
    got = Received()
    try:
        await near.connect()
        near.subscribe("mixed.order", inbox)
        await near.flush(propagated=True)
        await far.subscribe("mixed.order", cb=got.cb)
        await far.flush()
        await interest_reached(mesh["a"], "b", "mixed.order")
        before = await direct_events(mesh, "a")
        sent = [
            (
                str(i).encode() + b"\r\nHMSG x 1 2\r\n",
                "mixed.reply" if i % 3 == 0 else "",
                {"Seq": str(i)} if i % 3 == 1 else None,
            )
            for i in range(3000)
        ]
        for payload, reply, headers in sent:
            await pub.publish("mixed.order", payload, reply=reply, headers=headers)
        await pub.flush()
        await eventually(lambda: len(got.msgs) >= len(sent), timeout=30, what="every event at b")
        await eventually(lambda: len(inbox.events) >= len(sent), timeout=30, what="every event at a")
        assert [(m.data, m.reply, m.headers) for m in got.msgs] == sent
        assert [unwrap(body) for _, body in inbox.events] == [
            (
                reply,
                None if headers is None else b"NATS/1.0\r\nSeq: %s\r\n\r\n" % headers["Seq"].encode(),
                payload,
            )
            for payload, reply, headers in sent
        ]
        assert await direct_events(mesh, "a") - before > len(sent) // 2  # C took the PUBs and HPUBs
    finally:
        await near.close()
        for client in (pub, far):
            await client.close()
