"""A burst of interest changes crosses a route in INTEREST frames (many changes each) and converges
exactly; a node that does not take them (as nodes before them) still gets one frame per change."""

from __future__ import annotations

import asyncio

import pytest

from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.mesh import Inbox, link

BURST = 5_000


@pytest.mark.timeout(160)  # its waits add up to 140 s
@pytest.mark.parametrize("older", [False, True], ids=["batched", "older_peer"])
async def test_a_burst_of_subscriptions_is_fully_propagated(older: bool) -> None:
    older_b: dict[str, tuple[str, ...]] = {"b": ("--mesh-fault", "no_interest_batches")}
    node_args = older_b if older else None
    with MeshCluster(2, heartbeat_interval=1.0, node_args=node_args) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        holder = await MeshClient(cluster["a"].route_url).connect()
        prober = await MeshClient(cluster["b"].route_url).connect()
        inbox = Inbox()
        try:
            subs = [holder.subscribe(f"burst.{i}", inbox) for i in range(BURST)]  # no flush in between
            for i in range(0, BURST, 2):  # and half withdrawn at once, in the same burst
                holder.unsubscribe(subs[i])
            await holder.flush()

            async def propagated() -> bool:
                return bool((await link(cluster["b"], "a"))["patterns_remote"] == BURST // 2)

            await eventually(propagated, timeout=60, interval=0.05, what="the burst's interest at b")
            b_from_a = await link(cluster["b"], "a")
            assert b_from_a["sub_add_in"] == BURST
            assert b_from_a["sub_remove_in"] == BURST // 2
            if older:
                assert b_from_a["interest_frames_in"] == 0
            else:  # batched: a few frames carried them all
                assert 0 < b_from_a["interest_frames_in"] <= BURST // 100
            for i in range(BURST):
                await prober.publish(f"burst.{i}", b"x")
            await prober.flush()
            await eventually(lambda: len(inbox.events) >= BURST // 2, timeout=60, what="the odd ones' events")
            assert sorted(s for s, _ in inbox.events) == sorted(f"burst.{i}" for i in range(1, BURST, 2))
            assert b_from_a["bad_frames"] == 0
        finally:
            for client in (holder, prober):
                await client.close()
