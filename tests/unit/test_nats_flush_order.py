"""flush_in_order's loop, against a client that behaves as nats-py 2.16's does (the real one is in
tests/integration/test_nats_flush.py): a flush counts only when nothing was queued behind its PING."""

from __future__ import annotations

from typing import Any, cast

import pytest

from meshplane.transports.nats import flush_in_order


class QueueingClient:
    """``queued[i]``: bytes still queued for the flusher when flush number i is called."""

    def __init__(self, queued: list[int]) -> None:
        self.queued = queued
        self.flushes = 0

    @property
    def pending_data_size(self) -> int:
        return self.queued[min(self.flushes, len(self.queued) - 1)]

    async def flush(self, timeout: int) -> None:
        assert timeout >= 1  # nats-py takes whole seconds
        self.flushes += 1


@pytest.mark.parametrize(("queued", "flushes"), [([0], 1), ([120, 0], 2), ([120, 6, 40, 0], 4)])
async def test_it_returns_after_the_first_flush_sent_behind_nothing(queued: list[int], flushes: int) -> None:
    client = QueueingClient(queued)
    await flush_in_order(cast(Any, client), 5)
    assert client.flushes == flushes


async def test_a_queue_that_never_empties_ends_at_the_timeout() -> None:
    client = QueueingClient([100])  # other tasks keep publishing
    await flush_in_order(cast(Any, client), 0.05)
    assert client.flushes > 1  # it tried again until the timeout, then stopped
