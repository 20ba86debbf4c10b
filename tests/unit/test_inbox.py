"""The inbox between a NATS-like client and its subscriber: bounded, drops counted."""

from __future__ import annotations

from meshplane.transports.inbox import Inbox


async def test_put_many_keeps_what_fits_in_order_and_counts_the_rest() -> None:
    inbox = Inbox(limit=3)
    inbox.put_many([b"a", b"b"])
    inbox.put_many([b"c", b"d", b"e"])
    inbox.put(b"f")
    assert inbox.dropped == 3
    assert await inbox.take() == [b"a", b"b", b"c"]
    inbox.put_many([])
    inbox.put_many([b"g"])
    assert await inbox.take() == [b"g"]
    assert inbox.dropped == 3
