"""The broker's two relays (python, c) on real ZeroMQ sockets: delivery, counters, drops."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from meshplane.broker import Broker
from tests.helpers import wait_until

TOPIC = b"ns.component.endpoint.topic"


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def connect(
    ctx: zmq.Context[zmq.Socket[bytes]], kind: int, endpoint: str, **options: int
) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    sock.connect(endpoint)
    return sock


def receive_all(sock: zmq.Socket[bytes], count: int, timeout: float = 10.0) -> int:
    got = 0
    deadline = time.monotonic() + timeout
    while got < count and sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        sock.recv_multipart()
        got += 1
    return got


def eventually_stats(broker: Broker, condition: Callable[[dict[str, Any]], bool], what: str) -> None:
    wait_until(lambda: condition(broker.stats()), timeout=10, what=what)


@pytest.mark.parametrize("relay", ["python", "c"])
def test_relay_delivers_and_counts(relay: str, context: zmq.Context[zmq.Socket[bytes]]) -> None:
    broker = Broker("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", relay=relay)  # type: ignore[arg-type]
    address = broker.start()
    try:
        sub = connect(context, zmq.SUB, address.xpub)
        sub.setsockopt(zmq.SUBSCRIBE, b"ns.")
        pub = connect(context, zmq.XPUB, address.xsub)
        assert pub.poll(10_000), "the subscription did not reach the publisher through the broker"
        assert pub.recv() == b"\x01ns."
        eventually_stats(broker, lambda s: s["subscriptions"] == 1, "one live subscription")
        for i in range(1000):
            pub.send_multipart([TOPIC, b"header", i.to_bytes(4, "big"), b"payload"])
        assert receive_all(sub, 1000) == 1000
        if relay == "python":
            eventually_stats(
                broker, lambda s: s["messages_in"] == s["messages_out"] == 1000, "1000 in and out"
            )
        else:
            eventually_stats(
                broker, lambda s: s["frames_in"] == s["frames_out"] == 4000, "4000 frames in and out"
            )
            assert broker.stats()["messages_in"] is None
        eventually_stats(
            broker, lambda s: (s["publishers_connected"], s["subscribers_connected"]) == (1, 1), "peers"
        )
        assert broker.stats()["dropped"] == 0
        sub.setsockopt(zmq.UNSUBSCRIBE, b"ns.")
        eventually_stats(broker, lambda s: s["subscriptions"] == 0, "the unsubscription seen (XPUB_VERBOSER)")
    finally:
        broker.stop()


@pytest.mark.parametrize("relay", ["python", "c"])
def test_a_stalled_subscriber_causes_counted_drops_not_a_stall(
    relay: str, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    broker = Broker("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", hwm=5, drop_after=0.02, relay=relay)  # type: ignore[arg-type]
    address = broker.start()
    try:
        stalled = connect(context, zmq.SUB, address.xpub, RCVHWM=5, RCVBUF=65536)
        stalled.setsockopt(zmq.SUBSCRIBE, b"ns.")
        fast = connect(context, zmq.SUB, address.xpub)
        fast.setsockopt(zmq.SUBSCRIBE, b"ns.")
        pub = connect(context, zmq.XPUB, address.xsub, SNDHWM=0)
        eventually_stats(broker, lambda s: s["subscriptions"] == 2, "both subscriptions at the broker")
        assert pub.poll(10_000)  # and upstream (the publisher sees a topic's first subscription once)
        sent = 120
        big = b"x" * 256 * 1024  # fills the stalled subscriber's queues and TCP buffers quickly
        for i in range(sent):
            pub.send_multipart([TOPIC, b"header", i.to_bytes(4, "big"), big])
        received = receive_all(fast, sent, timeout=3)  # the fast subscriber gets all but the drops
        eventually_stats(
            broker, lambda s: s["dropped"] + received == sent, "every message delivered or dropped"
        )
        assert broker.stats()["dropped"] > 0
        if relay == "python":
            stats = broker.stats()
            assert (stats["messages_in"], stats["messages_out"]) == (sent, sent - stats["dropped"])
    finally:
        broker.stop()
