"""EventPublisher with a transport whose sends wait (a full queue under MESHPLANE_SEND_WHEN_FULL=wait, a
network): publishes take their sequences in turn, heartbeats never announce an event before it is handed
to the transport, and closing releases the publishes waiting their turn."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane import ClosedError, PlaneConfig, Scope
from meshplane.core.envelope import EventEnvelope
from meshplane.membership import Membership
from meshplane.publisher import EventPublisher
from meshplane.transports.base import PublisherTransport


class GatedTransport(PublisherTransport):
    """Records what it is handed, in order; every send waits until the gate opens."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.handed: list[tuple[str, int, Any]] = []  # ("event" | "heartbeat", sequence, payload)

    async def start(self) -> None:
        pass

    def discovery_transport(self) -> None:
        return None

    async def flush(self, timeout: float) -> None:
        pass

    async def send(self, envelope: EventEnvelope) -> None:
        await self.gate.wait()
        self.handed.append(("event", envelope.sequence, envelope.payload))

    async def send_many(self, envelopes: list[EventEnvelope]) -> None:
        await self.gate.wait()
        self.handed += [("event", e.sequence, e.payload) for e in envelopes]

    async def send_heartbeat(self, envelope: EventEnvelope) -> None:
        self.handed.append(("heartbeat", envelope.sequence, None))

    async def close(self) -> None:
        pass


class RoomTransport(GatedTransport):
    """As ZeroMQ under XPUB_NODROP: ``send_payload`` refuses while the gate is shut, and ``send`` waits."""

    def __init__(self) -> None:
        super().__init__()
        self.send_payload = self._send_payload

    def _send_payload(self, sequence: int, payload: bytes) -> int:
        if not self.gate.is_set():
            return errno.EAGAIN
        self.handed.append(("event", sequence, payload))
        return 0


def make_publisher(transport: PublisherTransport) -> EventPublisher:
    async def no_discovery() -> Any:
        raise AssertionError("not used")

    membership = Membership(PlaneConfig.from_env({}), no_discovery, lambda member: None)
    return EventPublisher(Scope.namespace("turns"), "t", 0x1234, transport, membership)


def check_announcements(handed: list[tuple[str, int, Any]]) -> None:
    """Every heartbeat announces at most the next sequence not yet handed over, as a subscriber reads it."""
    next_handed = 0
    for kind, sequence, _ in handed:
        if kind == "event":
            assert sequence == next_handed, f"event {sequence} out of turn in {handed}"
            next_handed += 1
        else:
            assert sequence <= next_handed, f"heartbeat announced {sequence} before it was sent: {handed}"


@pytest.mark.parametrize("how", ["publish", "publish_many"])
async def test_a_heartbeat_while_a_send_waits_announces_only_what_was_handed_over(how: str) -> None:
    transport = GatedTransport()
    pub = make_publisher(transport)
    waiting: asyncio.Future[Any]
    if how == "publish":
        waiting = asyncio.gather(*(pub.publish(b"%d" % i) for i in range(3)))
    else:
        waiting = asyncio.ensure_future(pub.publish_many([b"0", b"1", b"2"]))
    await asyncio.sleep(0)  # the sends are waiting at the gate
    await pub.send_heartbeat()
    transport.gate.set()
    await waiting
    await pub.send_heartbeat()
    assert transport.handed[0] == ("heartbeat", 0, None)  # not 3: nothing had been handed over
    assert transport.handed[-1] == ("heartbeat", 3, None)
    check_announcements(transport.handed)


async def test_concurrent_publishes_take_distinct_sequences_in_the_order_they_are_handed_over() -> None:
    transport = GatedTransport()
    pub = make_publisher(transport)

    async def publish(name: bytes) -> int:
        return await pub.publish(name)

    tasks = [asyncio.create_task(publish(b"%d" % i)) for i in range(5)]
    many = asyncio.create_task(pub.publish_many([b"m0", b"m1"]))
    await asyncio.sleep(0)
    await pub.send_heartbeat()
    transport.gate.set()
    sequences = [await task for task in tasks]
    assert sorted([*sequences, *await many]) == list(range(7))
    events = [(sequence, payload) for kind, sequence, payload in transport.handed if kind == "event"]
    returned = {s: b"%d" % i for i, s in enumerate(sequences)}
    returned.update(zip(await many, [b"m0", b"m1"], strict=True))
    assert events == sorted(returned.items())  # each payload under the sequence returned for it
    check_announcements(transport.handed)


async def test_a_publish_that_finds_room_on_its_turn_lets_the_next_one_in() -> None:
    transport = RoomTransport()
    pub = make_publisher(transport)
    tasks = [asyncio.create_task(pub.publish(b"%d" % i)) for i in range(4)]
    await asyncio.sleep(0)  # the first waits for room, the others for their turn
    transport.gate.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), 5) == [0, 1, 2, 3]
    assert [payload for _, _, payload in transport.handed] == [b"0", b"1", b"2", b"3"]


async def test_a_cancelled_publish_waiting_its_turn_passes_the_turn_on() -> None:
    transport = GatedTransport()
    pub = make_publisher(transport)
    first = asyncio.create_task(pub.publish(b"first"))
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(pub.publish(b"cancelled"))
    last = asyncio.create_task(pub.publish(b"last"))
    await asyncio.sleep(0)
    cancelled.cancel()
    transport.gate.set()
    assert (await first, await last) == (0, 1)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert [payload for _, _, payload in transport.handed] == [b"first", b"last"]


async def test_closing_releases_the_publishes_waiting_their_turn() -> None:
    transport = GatedTransport()
    pub = make_publisher(transport)
    first = asyncio.create_task(pub.publish(b"first"))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(pub.publish(b"queued")) for _ in range(3)]
    await asyncio.sleep(0)
    await pub.close()
    for task in queued:
        with pytest.raises(ClosedError):
            await asyncio.wait_for(task, 5)
    transport.gate.set()
    assert await first == 0  # the one already handed to the transport finishes


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["publish", "publish_many", "cancel", "heartbeat", "open", "shut", "step"]),
        max_size=30,
    )
)
def test_any_interleaving_hands_over_distinct_sequences_in_order(steps: list[str]) -> None:
    """Publishes and lists from many tasks, cancellations, heartbeats and a gate opening and shutting in
    any order: what reaches the transport is in sequence order with no sequence twice, each payload
    under the sequence its call returned, and no heartbeat announces an event before it was handed over."""

    async def run() -> None:
        transport = GatedTransport()
        pub = make_publisher(transport)
        tasks: list[tuple[asyncio.Task[Any], list[bytes]]] = []
        for number, step in enumerate(steps):
            if step == "publish":
                payload = [b"p%d" % number]
                tasks.append((asyncio.create_task(pub.publish(payload[0])), payload))
            elif step == "publish_many":
                payloads = [b"m%d.%d" % (number, i) for i in range(number % 3 + 1)]
                tasks.append((asyncio.create_task(pub.publish_many(payloads)), payloads))
            elif step == "cancel" and tasks:
                tasks[number % len(tasks)][0].cancel()
            elif step == "heartbeat":
                await pub.send_heartbeat()
            elif step == "open":
                transport.gate.set()
            elif step == "shut":
                transport.gate.clear()
            await asyncio.sleep(0)
        transport.gate.set()
        await asyncio.wait_for(asyncio.gather(*(task for task, _ in tasks), return_exceptions=True), 5)
        await pub.send_heartbeat()
        check_announcements_allowing_spent(transport.handed)
        handed = {sequence: payload for kind, sequence, payload in transport.handed if kind == "event"}
        for task, payloads in tasks:
            if not task.cancelled():
                result = task.result()
                sequences = [result] if isinstance(result, int) else list(result)
                assert [handed[s] for s in sequences] == payloads

    asyncio.run(run())


def check_announcements_allowing_spent(handed: list[tuple[str, int, Any]]) -> None:
    """Events in increasing sequence (a publish cancelled while waiting may have spent one), and no event
    handed over after a heartbeat that announced a sequence past it (the subscriber would drop it)."""
    events = [sequence for kind, sequence, _ in handed if kind == "event"]
    assert events == sorted(set(events)), f"out of order or twice: {handed}"
    for position, (kind, announced, _) in enumerate(handed):
        if kind == "heartbeat":
            later = [s for k, s, _ in handed[position + 1 :] if k == "event"]
            assert all(s >= announced for s in later), f"heartbeat {announced} before {later}: {handed}"
