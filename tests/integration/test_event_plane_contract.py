"""One contract, every transport x discovery backend, on real servers (nats-server, etcd, ZeroMQ sockets)."""

from __future__ import annotations

import uuid

import pytest

from meshplane import (
    ClosedError,
    EventEnvelope,
    EventPlane,
    EventPublisher,
    EventSubscriber,
    PayloadTooLarge,
    PlaneConfig,
    Scope,
)
from tests.helpers import eventually
from tests.support.plane import ready, registers_publishers


@pytest.fixture
def scope() -> Scope:
    """A namespace of the test's own: the servers outlive a test."""
    return Scope.endpoint(f"contract-{uuid.uuid4().hex[:8]}", "worker", "generate")


async def receive(sub: EventSubscriber, n: int) -> list[EventEnvelope]:
    return [await sub.next(timeout=10) for _ in range(n)]


async def test_publish_then_receive_in_order(plane_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "kv-events")
        pub = await plane.publisher(scope, "kv-events")
        await ready(pub)
        for i in range(500):
            assert await pub.publish({"i": i}) == i
        events = await receive(sub, 500)
        assert [e.decode() for e in events] == [{"i": i} for i in range(500)]
        assert [e.sequence for e in events] == list(range(500))
        assert {e.publisher_id for e in events} == {pub.publisher_id}
        assert {e.topic for e in events} == {"kv-events"}
        assert sub.stats.received == 500
        assert sub.stats.gaps == 0


async def test_raw_bytes_payload_is_delivered_unchanged(plane_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "raw")
        pub = await plane.publisher(scope, "raw")
        await ready(pub)
        await pub.publish(b"\x00\xffraw bytes")
        assert (await sub.next(10)).payload == b"\x00\xffraw bytes"


async def test_topic_matching_is_exact(plane_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(plane_config) as plane:
        sub_kv = await plane.subscriber(scope, "kv")
        sub_kv_events = await plane.subscriber(scope, "kv-events")
        pub_kv_events = await plane.publisher(scope, "kv-events")
        pub_kv = await plane.publisher(scope, "kv")
        await ready(pub_kv_events)
        await ready(pub_kv)
        for i in range(20):
            await pub_kv_events.publish(i)
        await pub_kv.publish("only-kv")
        assert (await sub_kv.next(10)).decode() == "only-kv"
        assert [e.decode() for e in await receive(sub_kv_events, 20)] == list(range(20))
        # None of kv-events' reached kv: once they all arrived where they belong, kv's next is this.
        await pub_kv.publish("marker")
        assert (await sub_kv.next(10)).decode() == "marker"


async def test_fan_in_from_several_publishers_in_one_process(plane_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "fan-in")
        pubs = [await plane.publisher(scope, "fan-in") for _ in range(3)]
        assert len({p.publisher_id for p in pubs}) == 3
        discovery = await plane.discovery()
        keys = await discovery.list(scope.channel_prefix("fan-in"))
        expected = {p.channel.key for p in pubs if p.channel} if registers_publishers(plane_config) else set()
        assert set(keys) == expected
        assert len(expected) == (3 if registers_publishers(plane_config) else 0)
        for pub in pubs:
            await ready(pub)
        for i in range(100):
            for pub in pubs:
                await pub.publish(i)
        events = await receive(sub, 300)
        for pub in pubs:
            mine = [e.decode() for e in events if e.publisher_id == pub.publisher_id]
            assert mine == list(range(100))
        discovered = 3 if registers_publishers(plane_config) else 0
        await eventually(lambda: sub.stats.publishers_discovered == discovered, what="publishers discovered")


async def test_publisher_joining_late_is_picked_up(plane_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "late")
        early = await plane.publisher(scope, "late")
        await ready(early)
        await early.publish("early")
        assert (await sub.next(10)).decode() == "early"
        late = await plane.publisher(scope, "late")
        await ready(late)
        await late.publish("late")
        envelope = await sub.next(10)
        assert (envelope.decode(), envelope.publisher_id) == ("late", late.publisher_id)


async def test_subscriber_created_after_publisher_finds_it(plane_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(plane_config) as plane:
        pub = await plane.publisher(scope, "before")
        sub = await plane.subscriber(scope, "before")
        await ready(pub)
        await pub.publish("hello")
        assert (await sub.next(10)).decode() == "hello"
        if registers_publishers(plane_config):
            assert [c.instance_id for c in sub.publishers.values()] == [pub.publisher_id]


async def test_removed_publisher_is_disconnected(
    plane_config: PlaneConfig, scope: Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not registers_publishers(plane_config):
        pytest.skip("broker mode registers no publishers, so there is no record to remove")
    # This pins that the connection is let go, not after how long: a tenth of the linger's second
    # instead of waiting it out on each ZeroMQ mode.
    monkeypatch.setattr("meshplane.transports.zmq.LEAVING_LINGER", 0.1)
    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "removal")
        staying = await plane.publisher(scope, "removal")
        leaving = await plane.publisher(scope, "removal")
        await ready(staying)
        await ready(leaving)
        await eventually(lambda: sub.stats.publishers_discovered == 2, what="both publishers discovered")
        # Take the record away while the publisher's socket stays open: discovery is the authority.
        assert leaving.channel is not None
        await (await plane.discovery()).unregister(leaving.channel.key)
        await eventually(lambda: sub.stats.publishers_discovered == 1, what="removal seen")
        assert [c.instance_id for c in sub.publishers.values()] == [staying.publisher_id]
        if plane_config.event_plane == "zmq":
            await eventually(lambda: leaving.subscriber_count == 0, what="subscriber disconnected")
            await leaving.publish("must not arrive")
        await staying.publish("still here")
        envelope = await sub.next(10)
        assert envelope.publisher_id == staying.publisher_id


async def test_close_unregisters(plane_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(plane_config) as plane:
        discovery = await plane.discovery()
        prefix = scope.channel_prefix("closing")
        async with await plane.publisher(scope, "closing") as pub:
            if registers_publishers(plane_config):
                assert pub.channel is not None
                assert list(await discovery.list(prefix)) == [pub.channel.key]
            else:
                assert pub.channel is None
        assert await discovery.list(prefix) == {}
        with pytest.raises(ClosedError):
            await pub.publish(b"x")


async def test_private_plane_from_config(plane_config: PlaneConfig, scope: Scope) -> None:
    """``create`` without a plane builds and owns one; close releases it."""
    sub = await EventSubscriber.create(scope, "private", config=plane_config)
    pub = await EventPublisher.create(scope, "private", config=plane_config)
    try:
        await ready(pub)
        await pub.publish("x")
        assert (await sub.next(10)).decode() == "x"
    finally:
        await pub.close()
        await sub.close()
    with pytest.raises(ClosedError):
        await sub.next(1)


async def test_oversized_payload_is_refused_and_nothing_is_sent(
    plane_config: PlaneConfig, scope: Scope
) -> None:
    async with EventPlane(plane_config.replace(max_message_bytes=1000)) as plane:
        sub = await plane.subscriber(scope, "big")
        pub = await plane.publisher(scope, "big")
        await ready(pub)
        with pytest.raises(PayloadTooLarge, match="1000"):
            await pub.publish(b"x" * 1001)
        await pub.publish(b"small")
        envelope = await sub.next(10)
        assert (envelope.payload, envelope.sequence) == (b"small", 0)


async def test_closing_a_subscriber_ends_iteration(plane_config: PlaneConfig, scope: Scope) -> None:
    import asyncio

    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "end")
        pub = await plane.publisher(scope, "end")
        await ready(pub)
        got: list[str] = []

        async def consume() -> None:
            async for envelope in sub:
                got.append(envelope.decode())

        task = asyncio.create_task(consume())
        await pub.publish("first")
        # Once it is seen, the loop waits for the next event (its only suspension): close ends that wait.
        await eventually(lambda: got == ["first"], what="the first event iterated")
        await sub.close()
        await asyncio.wait_for(task, 5)
        assert got == ["first"]


async def test_a_publisher_can_wait_for_its_subscribers(plane_config: PlaneConfig, scope: Scope) -> None:
    """The slow-joiner cure on every transport: nothing published after the wait is lost."""
    async with EventPlane(plane_config) as pub_plane, EventPlane(plane_config) as sub_plane:
        pub = await pub_plane.publisher(scope, "joiners")
        with pytest.raises(TimeoutError, match="0 of 1 subscribers"):
            await pub.wait_for_subscribers(1, timeout=0.2)
        subs = [await sub_plane.subscriber(scope, "joiners") for _ in range(2)]
        # in broker mode a subscription arrives through each broker
        per_subscriber = len((await pub_plane.broker_directory()).brokers) if plane_config.broker_mode else 1
        await pub.wait_for_subscribers(2 * per_subscriber, timeout=10)
        await pub.publish("first")
        for sub in subs:
            assert (await sub.next(10)).decode() == "first"


async def test_publish_many_and_batches_keep_order_and_accounting(
    plane_config: PlaneConfig, scope: Scope
) -> None:
    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "batched")
        pub = await plane.publisher(scope, "batched")
        await ready(pub)
        assert await pub.publish_many({"i": i} for i in range(300)) == range(300)
        assert await pub.publish("single") == 300
        received: list[EventEnvelope] = []
        async for batch in sub.batches(max_events=64):
            assert 1 <= len(batch) <= 64
            received.extend(batch)
            if len(received) >= 301:
                break
        assert [e.sequence for e in received] == list(range(301))
        assert [e.decode() for e in received] == [{"i": i} for i in range(300)] + ["single"]
        assert (sub.stats.received, sub.stats.gaps, sub.stats.duplicates) == (301, 0, 0)


async def test_a_batch_waits_up_to_max_wait_to_fill_and_closing_ends_the_batches(
    plane_config: PlaneConfig, scope: Scope
) -> None:
    import asyncio

    async with EventPlane(plane_config) as plane:
        sub = await plane.subscriber(scope, "filled")
        pub = await plane.publisher(scope, "filled")
        await ready(pub)
        batches = sub.batches(max_events=10, max_wait=10)
        for i in range(25):
            await pub.publish(i)
        assert [e.decode() for e in await anext(batches)] == list(range(10))
        assert [e.decode() for e in await anext(batches)] == list(range(10, 20))
        last = asyncio.ensure_future(anext(batches))  # 5 events: waits for 5 more, or the close
        await eventually(lambda: sub.stats.received == 25, what="all 25 received")
        await sub.close()
        assert [e.decode() for e in await asyncio.wait_for(last, 5)] == list(range(20, 25))
        with pytest.raises(StopAsyncIteration):
            await anext(batches)


async def test_publish_many_checks_every_payload_before_sending_any(
    plane_config: PlaneConfig, scope: Scope
) -> None:
    async with EventPlane(plane_config.replace(max_message_bytes=1000)) as plane:
        sub = await plane.subscriber(scope, "big-batch")
        pub = await plane.publisher(scope, "big-batch")
        await ready(pub)
        with pytest.raises(PayloadTooLarge, match="1000"):
            await pub.publish_many([b"fits", b"x" * 1001])
        await pub.publish(b"after")
        envelope = await sub.next(10)
        assert (envelope.payload, envelope.sequence) == (b"after", 0)
