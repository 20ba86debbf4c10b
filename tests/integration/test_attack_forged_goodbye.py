"""A reviewer's attack: a goodbye forged by a third party. A publisher's goodbye is a heartbeat whose
news says ``final``, and nothing binds it to the publisher whose id it carries: any peer that can put a
frame on the topic could send one with a live publisher's id, and every subscriber then dropped that
publisher's events. Now what follows a goodbye in sequence is delivered, and counted as a goodbye
contradicted; only what came before it (copies through other brokers) is dropped."""

from __future__ import annotations

import time
import uuid
from typing import cast

import pytest

from meshplane import EventPlane, PlaneConfig, PublisherLeft, Scope
from meshplane.core.envelope import EventEnvelope
from meshplane.core.framing import _dynamo_heartbeat, dynamo_zmq_frames
from meshplane.core.heads import encode_news
from meshplane.transports.zmq import XPubPublisher
from tests.support.plane import ready

pytestmark = pytest.mark.parametrize("plane_config", [("zmq", "file"), ("zmq-curve", "file")], indirect=True)


async def test_a_third_partys_goodbye_does_not_silence_a_live_publisher(plane_config: PlaneConfig) -> None:
    scope = Scope.endpoint(f"forged-{uuid.uuid4().hex[:8]}", "worker", "generate")
    config = plane_config.replace(heartbeat_period=0.2)
    async with EventPlane(config) as plane, EventPlane(config) as stranger:
        sub = await plane.subscriber(scope, "t")
        victim = await plane.publisher(scope, "t")
        attacker = await stranger.publisher(scope, "t")
        await ready(victim)
        await ready(attacker)
        await victim.publish("before")
        assert (await sub.next(timeout=10)).sequence == 0
        # The stranger's socket carries a final heartbeat with the victim's id (what any peer can send).
        news = encode_news(0, final=True)
        forged = EventEnvelope(victim.publisher_id, 1, time.time_ns() // 1_000_000, victim.topic, news)
        transport = cast(XPubPublisher, attacker._transport)
        frames = dynamo_zmq_frames(transport._routing_topic, _dynamo_heartbeat(forged))  # the victim's id
        assert transport._socket is not None
        transport._socket.send_multipart(frames)
        for i in range(5):
            await victim.publish(f"after-{i}")
        got: list[int] = []
        try:
            while len(got) < 5:
                got.append((await sub.next(timeout=5)).sequence)
        except TimeoutError:
            pass
        left = [n for n in sub.recent_notices if isinstance(n, PublisherLeft)]
        assert got == [1, 2, 3, 4, 5], (got, left, sub.stats, list(sub.recent_notices))
        # The goodbye has been read: the victim's connection must still be there for what it sends now
        # (dropping it on a goodbye silenced the victim from then on).
        for i in range(5, 10):
            await victim.publish(f"after-{i}")
        for sequence in range(6, 11):
            assert (await sub.next(timeout=5)).sequence == sequence, sub.stats
