"""ZeroMQ CURVE against those it must keep out: a subscriber without an allowed key, a plain socket, a
forged discovery record pointing at a rogue publisher, a client of a broker without the right keys."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from meshplane import EventPlane, EventPublisher, PlaneConfig, Scope
from meshplane.core.records import TRANSPORT_ZMQ, EventChannel
from meshplane.transports.zmq import ZmqSubscriberTransport
from tests.conftest import CurveKeys, make_config, running_brokers
from tests.helpers import eventually, one_event_through


def curve_config(tmp_path: Path, keys: CurveKeys, name: str = "plane", **extra: object) -> PlaneConfig:
    return make_config(
        "zmq",
        "file",
        tmp_path,
        None,
        None,
        zmq_curve_cert=keys.secret(name),
        zmq_curve_allowed=keys.allowed,
        **extra,
    )


@pytest.fixture
def scope() -> Scope:
    return Scope.endpoint(f"curve-{uuid.uuid4().hex[:8]}", "worker", "generate")


async def publish_for(pub: EventPublisher, seconds: float) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        await pub.publish(b"secret")
        await asyncio.sleep(0.01)


async def test_the_record_carries_the_key_and_an_allowed_subscriber_receives(
    tmp_path: Path, curve_keys: CurveKeys, scope: Scope
) -> None:
    async with EventPlane(curve_config(tmp_path, curve_keys)) as plane:
        pub = await plane.publisher(scope, "keyed")
        assert pub.channel is not None
        assert pub.channel.zmq_curve_key == curve_keys.public_key("plane")
        assert await one_event_through(plane, scope, b"hello") == b"hello"


async def test_a_subscriber_without_an_allowed_key_gets_nothing(
    tmp_path: Path, curve_keys: CurveKeys, scope: Scope
) -> None:
    async with (
        EventPlane(curve_config(tmp_path, curve_keys)) as plane,
        EventPlane(curve_config(tmp_path, curve_keys, "intruder")) as intruders,
    ):
        pub = await plane.publisher(scope, "t")
        intruder = await intruders.subscriber(scope, "t")  # trusts the publisher; is not trusted by it
        assert pub.channel is not None
        endpoint = pub.channel.zmq_endpoint
        assert endpoint is not None
        context = zmq.asyncio.Context()
        plain = context.socket(zmq.SUB)  # and a socket that speaks no CURVE at all
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        plain.connect(endpoint)
        try:
            await publish_for(pub, 1.0)
            assert pub.subscriber_count == 0
            assert intruder.stats.received == 0
            with pytest.raises(zmq.Again):
                await plain.recv(zmq.NOBLOCK)
        finally:
            plain.close(0)
            context.term()


async def test_a_forged_record_cannot_point_a_subscriber_at_a_rogue_publisher(
    tmp_path: Path, curve_keys: CurveKeys, scope: Scope
) -> None:
    async with (
        EventPlane(curve_config(tmp_path, curve_keys)) as plane,
        EventPlane(curve_config(tmp_path, curve_keys, "intruder")) as rogues,
    ):
        sub = await plane.subscriber(scope, "t")
        transport = sub._transport
        assert isinstance(transport, ZmqSubscriberTransport)
        rogue = await rogues.publisher(scope, "t")  # registers its own, untrusted, key
        assert rogue.channel is not None
        await eventually(lambda: transport.untrusted_publishers >= 1, what="the rogue's record refused")
        # A record claiming the trusted key, at the rogue's address: the handshake fails.
        claims = {
            "endpoint": rogue.channel.zmq_endpoint,
            "curve_public_key": curve_keys.public_key("plane").decode(),
        }
        forged = EventChannel(scope, "t", 77, TRANSPORT_ZMQ, claims)
        await (await plane.discovery()).register(forged.key, forged.to_json())
        await eventually(lambda: transport.connected_publishers == 1, what="connecting to the forged record")
        await publish_for(rogue, 1.0)
        assert sub.stats.received == 0
        assert rogue.subscriber_count == 0


async def test_broker_clients_need_the_keys(tmp_path: Path, curve_keys: CurveKeys, scope: Scope) -> None:
    with running_brokers(("--no-register",), env=curve_keys.broker_env()) as (broker,):
        brokers = (broker.address,)
        allowed = curve_config(
            tmp_path, curve_keys, zmq_brokers=brokers, zmq_curve_broker_key=str(curve_keys.public("broker"))
        )
        intruder = curve_config(
            tmp_path,
            curve_keys,
            "intruder",
            zmq_brokers=brokers,
            zmq_curve_broker_key=str(curve_keys.public("broker")),
        )
        async with EventPlane(allowed) as plane, EventPlane(intruder) as intruders:
            snoop = await intruders.subscriber(scope, "t")
            assert await one_event_through(plane, scope, b"through the broker") == b"through the broker"
            await publish_for(await plane.publisher(scope, "t"), 0.5)
            assert snoop.stats.received == 0
