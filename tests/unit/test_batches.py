"""core/batches.py: the batch decoder against the 8-byte-header decoder item by item, and the tally of an
XPUB socket's subscriptions that decides whether a list may go as batch messages."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.batches import SubscriptionTally, batch_topic, decode_batch
from meshplane.core.envelope import EventEnvelope
from meshplane.core.framing import MessageType, WireFormat, encode_nats
from meshplane.errors import MalformedFrame, WireError

TOPIC = b"ns.kv"


def item(sequence: int, payload: bytes = b"x", kind: MessageType = MessageType.EVENT) -> bytes:
    return encode_nats(EventEnvelope(7, sequence, 1, "kv", payload), WireFormat.HEADER8, message_type=kind)


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20))
def test_a_batch_of_events_decodes_to_its_events_in_order(payloads: list[bytes]) -> None:
    decoded = decode_batch(b"".join(item(i, p) for i, p in enumerate(payloads)), TOPIC, 1000)
    assert decoded == [EventEnvelope(7, i, 1, "kv", p) for i, p in enumerate(payloads)]


def kinds(decoded: Sequence[object]) -> list[str]:
    return [type(d).__name__ for d in decoded]


def test_bad_items_are_errors_in_their_place_and_a_bad_length_ends_the_batch() -> None:
    good, oversized = item(0), item(1, b"y" * 2000)
    assert kinds(decode_batch(good + oversized + good, TOPIC, 1000)) == [
        "EventEnvelope",
        "OversizedFrame",
        "EventEnvelope",
    ]
    runs_past = good + good[:4] + (10_000).to_bytes(4, "big") + good[8:]
    decoded = decode_batch(runs_past, TOPIC, 1000)
    assert kinds(decoded) == ["EventEnvelope", "TruncatedFrame"]
    assert str(decoded[1]) == f"batch item announces 10008 bytes, {len(good)} left"
    assert kinds(decode_batch(good + b"\x02\x00", TOPIC, 1000)) == ["EventEnvelope", "TruncatedFrame"]
    assert isinstance(decode_batch(b"", TOPIC, 1000)[0], MalformedFrame)
    heartbeat = decode_batch(item(3, kind=MessageType.HEARTBEAT), TOPIC, 1000)
    assert not isinstance(heartbeat[0], EventEnvelope | WireError)  # a Frame, as the 2-frame message's


@given(st.binary(max_size=200))
def test_any_bytes_decode_to_items_or_errors_without_raising(data: bytes) -> None:
    for decoded in decode_batch(data, TOPIC, 100):
        assert isinstance(decoded, EventEnvelope | WireError) or hasattr(decoded, "message_type")


def test_batches_are_welcome_only_when_every_subscription_is_a_batch_taking_subscribers() -> None:
    tally = SubscriptionTally(TOPIC)
    batch = batch_topic(TOPIC)
    assert not tally.batches_welcome  # nobody
    tally.add(b"\x01" + batch)  # a meshplane subscriber's two subscriptions, in either order
    assert not tally.batches_welcome
    tally.add(b"\x01" + TOPIC)
    assert tally.batches_welcome
    tally.add(b"\x01" + TOPIC)  # the Dynamo runtime: the routing topic alone
    assert (tally.plain, tally.batches, tally.batches_welcome) == (2, 1, False)
    tally.add(b"\x00" + TOPIC)
    assert tally.batches_welcome
    tally.add(b"\x01")  # every topic: it would see batch messages
    assert not tally.batches_welcome
    tally.add(b"\x00")
    tally.add(b"\x01ns.k")  # a prefix of the routing topic: it would miss them
    assert (tally.other, tally.batches_welcome) == (1, False)
    tally.add(b"\x00ns.k")
    tally.add(b"garbage")  # not a subscription message: ignored
    assert (tally.plain, tally.batches, tally.other, tally.batches_welcome) == (1, 1, 0, True)
