"""Batch messages (core/batches.py) over real ZeroMQ sockets: a direct-mode publisher sends a list as batch
messages only while every subscriber takes them, and every subscriber gets every event, in order, either
way: meshplane's, one without the C extension, a raw SUB as the Dynamo runtime subscribes (the routing
topic only), a raw SUB of every topic."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq

from meshplane import EventPlane, EventPublisher, EventSubscriber, PlaneConfig, Scope
from meshplane.core.batches import BATCH_AT_LEAST, SubscriptionTally, batch_topic
from meshplane.core.framing import decode_zmq
from meshplane.transports.zmq_messages import ListSender
from tests.conftest import make_config
from tests.helpers import eventually

TOTAL = 1000


@pytest.fixture(params=["dynamo", "header8"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> PlaneConfig:
    return make_config("zmq", "file", tmp_path, None, None, wire_format=request.param)


@pytest.fixture
def scope() -> Scope:
    return Scope.endpoint(f"batches{uuid.uuid4().hex[:8]}", "worker", "generate")


@pytest.fixture
async def plane(config: PlaneConfig) -> AsyncIterator[EventPlane]:
    async with EventPlane(config) as plane:
        yield plane


def subscriptions(pub: EventPublisher) -> SubscriptionTally:
    """The publisher's tally, with the (un)subscriptions waiting in its socket read."""
    assert pub.subscriber_count is not None
    tally: SubscriptionTally = pub._transport._subscriptions  # type: ignore[attr-defined]
    return tally


def list_sender(pub: EventPublisher) -> ListSender:
    sender = pub._transport.send_payloads
    assert isinstance(sender, ListSender)
    return sender


async def receive_all(sub: EventSubscriber, count: int) -> list[int]:
    sequences = [(await sub.next(10)).sequence for _ in range(count)]
    assert (sub.stats.gaps, sub.stats.missing, sum(sub.stats.malformed.values())) == (0, 0, 0)
    return sequences


async def test_a_list_to_meshplane_subscribers_goes_as_batch_messages(
    plane: EventPlane, scope: Scope
) -> None:
    subs = [await plane.subscriber(scope, "t") for _ in range(2)]
    pub = await plane.publisher(scope, "t")
    await pub.wait_for_subscribers(2, timeout=10)
    await eventually(lambda: subscriptions(pub).batches == 2)
    payloads = [b"%d" % i + b"x" * (i % 300) for i in range(TOTAL)]
    assert await pub.publish_many(payloads) == range(TOTAL)
    await pub.publish(b"one")  # a single event goes as its own message, after the batches
    assert await pub.publish_many([b"short"] * (BATCH_AT_LEAST - 1)) == range(
        TOTAL + 1, TOTAL + BATCH_AT_LEAST
    )
    assert list_sender(pub).batched == 1
    for sub in subs:
        events = [await sub.next(10) for _ in range(TOTAL + BATCH_AT_LEAST)]
        assert [e.sequence for e in events] == list(range(TOTAL + BATCH_AT_LEAST))
        assert [e.payload for e in events[:TOTAL]] == payloads
        assert events[TOTAL].payload == b"one"
        assert (sub.stats.gaps, sub.stats.missing, sum(sub.stats.malformed.values())) == (0, 0, 0)


@pytest.mark.parametrize("prefix", ["routing topic", "everything"])
async def test_a_raw_subscriber_turns_batches_off_and_gets_every_event(
    plane: EventPlane, scope: Scope, prefix: str
) -> None:
    """The Dynamo runtime subscribes to the routing topic alone; a raw tool may subscribe to b"". While
    either is connected, lists go event by event; once it leaves, as batch messages again."""
    sub = await plane.subscriber(scope, "t")
    pub = await plane.publisher(scope, "t")
    await pub.wait_for_subscribers(1, timeout=10)
    assert pub.channel is not None
    routing = pub._transport._routing_topic  # type: ignore[attr-defined]
    raw: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    try:
        raw.setsockopt(zmq.SUBSCRIBE, routing if prefix == "routing topic" else b"")
        raw.connect(pub.channel.zmq_endpoint or "")
        if prefix == "routing topic":
            await pub.wait_for_subscribers(2, timeout=10)
        else:  # a subscription to b"" is no subscriber of the routing topic, but it would see batches
            await eventually(lambda: subscriptions(pub).other == 1)
        assert await pub.publish_many([b"x"] * TOTAL) == range(TOTAL)
        assert list_sender(pub).batched == 0
        assert await receive_all(sub, TOTAL) == list(range(TOTAL))
        raw_sequences = []
        for _ in range(TOTAL):
            assert raw.poll(10_000)
            frames = raw.recv_multipart()
            assert frames[0] != batch_topic(routing)
            raw_sequences.append(decode_zmq(frames).envelope.sequence)
        assert raw_sequences == list(range(TOTAL))
    finally:
        raw.close(0)
    await eventually(lambda: subscriptions(pub).batches_welcome)
    await pub.publish_many([b"y"] * TOTAL)
    assert list_sender(pub).batched == 1
    assert await receive_all(sub, TOTAL) == list(range(TOTAL, 2 * TOTAL))


async def test_a_subscriber_without_the_extension_turns_batches_off(
    plane: EventPlane, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = await plane.subscriber(scope, "t")
    monkeypatch.setenv("MESHPLANE_NO_EXTENSIONS", "1")  # read at the socket's opening
    plain = await plane.subscriber(scope, "t")
    monkeypatch.delenv("MESHPLANE_NO_EXTENSIONS")
    pub = await plane.publisher(scope, "t")
    await pub.wait_for_subscribers(2, timeout=10)
    await eventually(lambda: subscriptions(pub).batches == 1)
    await pub.publish_many([b"x"] * TOTAL)
    assert list_sender(pub).batched == 0
    for sub in (compiled, plain):
        assert await receive_all(sub, TOTAL) == list(range(TOTAL))


async def test_a_batch_message_kept_at_a_reconnection_comes_back_as_its_events(
    plane: EventPlane, scope: Scope
) -> None:
    """A disconnect receives the next message first (libzmq would abort otherwise); when that is a batch
    message, the next receive returns its events, in order."""
    sub = await plane.subscriber(scope, "t")
    pub = await plane.publisher(scope, "t")
    await pub.wait_for_subscribers(1, timeout=10)
    await eventually(lambda: subscriptions(pub).batches_welcome)
    await pub.publish_many([b"x"] * BATCH_AT_LEAST)
    transport = sub._transport
    await eventually(lambda: transport.unread())
    transport.reconnect_publisher(pub.publisher_id)
    assert await receive_all(sub, BATCH_AT_LEAST) == list(range(BATCH_AT_LEAST))
