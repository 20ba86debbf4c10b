"""A mesh client's guaranteed publishes awaiting their ACK: bounded, first come first served, each
failed once its timeout passes (one timer for all), none lost from what a new connection resends."""

from __future__ import annotations

import asyncio

import pytest

from meshplane.core.mesh.frames import FLAG_GUARANTEED, Frame, FrameReader, encode_event
from meshplane.errors import TransportError
from meshplane.mesh.unconfirmed import Unconfirmed
from tests.helpers import eventually


async def test_answers_come_from_confirmations_and_resends_keep_the_order() -> None:
    pending = Unconfirmed(10, "tcp://node")
    first = pending.add(1, b"one", "s", 30)
    second = pending.add(2, b"two", "s", 30)
    assert pending.raws("") == [b"one", b"two"]
    pending.confirm(2, "")
    pending.confirm(1, "disk full")
    pending.confirm(1, "a second ACK is ignored")
    await second
    with pytest.raises(TransportError, match="tcp://node did not store the event: disk full"):
        await first
    assert len(pending) == 0


async def test_publishers_beyond_the_limit_wait_their_turn() -> None:
    pending = Unconfirmed(2, "tcp://node")
    order: list[int] = []

    async def publisher(sequence: int) -> None:
        await pending.room()
        order.append(sequence)
        pending.add(sequence, b"", "s", 30)

    tasks = [asyncio.create_task(publisher(n)) for n in range(5)]
    await eventually(lambda: order == [0, 1])
    cancelled = tasks[2]
    cancelled.cancel()  # a waiter that gives up leaves its turn to the next
    pending.confirm(0, "")
    await eventually(lambda: order == [0, 1, 3])
    pending.confirm(1, "")
    pending.confirm(3, "")
    await eventually(lambda: order == [0, 1, 3, 4])
    assert cancelled.cancelled()
    assert len(pending) == 1


async def test_each_publish_fails_when_its_timeout_passes_and_makes_room() -> None:
    pending = Unconfirmed(1, "tcp://node")
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = pending.add(1, b"", "orders.eu", 0.2)
    waiter = asyncio.create_task(pending.room())
    with pytest.raises(TransportError, match=r"orders\.eu.*within 0\.2s: it may or may not have been stored"):
        await answer
    assert loop.time() - started >= 0.2
    await asyncio.wait_for(waiter, 5)  # the expired one made room
    later = pending.add(2, b"", "s", 0.1)
    pending.confirm(2, "")
    await later
    assert pending.raws("") == []


async def test_a_batched_ack_confirms_the_numbers_it_lists_and_makes_room() -> None:
    pending = Unconfirmed(3, "tcp://node")
    answers = {n: pending.add(n, b"%d" % n, "s", 30) for n in (1, 2, 3)}
    waiter = asyncio.create_task(pending.room())
    pending.confirm_stored((3, 1, 99))  # a number it does not hold (answered already) is ignored
    await answers[1]
    await answers[3]
    await waiter
    assert not answers[2].done()
    assert pending.raws("") == [b"2"]


async def test_an_unknown_answer_keeps_the_publish_waiting_to_be_sent_again_as_it_was() -> None:
    """Issue 53, item 3: "unknown" is neither stored nor refused: the same frame (the same event id)
    goes again, and the publish fails only when its timeout passes, saying what it last heard."""
    pending = Unconfirmed(10, "tcp://node")
    answer = pending.add(1, b"one", "s", 0.2)
    assert pending.confirm(1, "unknown: this HA mate lost its lease") == b"one"
    assert pending.waiting(1) == b"one"
    assert pending.raws("") == [b"one"]  # a new connection sends it again too
    assert not answer.done()
    with pytest.raises(TransportError, match=r"may or may not have been stored \(last answer: unknown"):
        await answer
    assert pending.waiting(1) is None
    again = pending.add(2, b"two", "s", 30)
    assert pending.confirm(2, "unknown: fsync failed") == b"two"
    assert pending.confirm(2, "") is None
    await again


async def test_resends_under_another_origin_are_stamped_with_it_and_stay_whole() -> None:
    pending = Unconfirmed(10, "tcp://node")
    raw = encode_event("0123456789abcdef", "s.x", 7, 123, b"body", FLAG_GUARANTEED)
    pending.add(7, raw, "s.x", 30)
    assert pending.raws("0123456789abcdef") == [raw]  # the node let the client keep its origin
    (resent,) = pending.raws("fedcba9876543210")
    (frame,) = FrameReader().feed(resent)
    assert isinstance(frame, Frame)
    assert (frame.source, frame.subject, frame.sequence, frame.flags) == ("fedcba9876543210", "s.x", 7, 4)
    assert frame.payload == FrameReader().feed(raw)[0].payload  # type: ignore[union-attr]
