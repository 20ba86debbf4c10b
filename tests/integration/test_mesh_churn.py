"""Interest churn on real nodes: thousands of subscriptions replaced on one node converge on its peer,
which then routes exactly the new ones (issue 60; the bench's ``--parts churn`` times it)."""

from __future__ import annotations

import asyncio

import pytest

from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.mesh import Inbox, link

CLIENTS = 10
EACH = 1_000


@pytest.mark.timeout(280)  # its waits add up to 260 s
async def test_ten_thousand_subscriptions_replaced_converge_and_route_only_the_new() -> None:
    with MeshCluster(2, heartbeat_interval=1.0) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        holders = [await MeshClient(cluster["a"].route_url).connect() for _ in range(CLIENTS)]
        prober = await MeshClient(cluster["b"].route_url).connect()
        inbox = Inbox()
        try:
            subs = [
                [h.subscribe(f"churn.old.{c}.{i}", inbox) for i in range(EACH)] for c, h in enumerate(holders)
            ]
            for holder in holders:
                await holder.flush()
            await eventually(
                lambda: _remote_patterns(cluster, CLIENTS * EACH), timeout=60, what="the old interest at b"
            )
            connects = (await link(cluster["b"], "a"))["connects"]
            for c, holder in enumerate(holders):
                for i in range(EACH):
                    holder.unsubscribe(subs[c][i])
                    holder.subscribe(f"churn.new.{c}.{i}", inbox)
                await holder.flush()
            last = f"churn.new.{CLIENTS - 1}.{EACH - 1}"

            async def probed() -> bool:  # a link carries interest in order: the last change is the last
                await prober.publish(last, b"probe")
                await prober.flush()
                await asyncio.sleep(0.005)
                return any(subject == last for subject, _ in inbox.events)

            await eventually(probed, timeout=120, interval=0.05, what="the last new subscription at b")
            assert (await link(cluster["b"], "a"))["patterns_remote"] == CLIENTS * EACH
            out_before = (await link(cluster["b"], "a"))["events_out"]
            inbox.events.clear()
            for c in range(CLIENTS):  # the old subjects first: b handles them before the new ones
                for i in range(0, EACH, 10):
                    await prober.publish(f"churn.old.{c}.{i}", b"old")
            for c in range(CLIENTS):
                for i in range(0, EACH, 10):
                    await prober.publish(f"churn.new.{c}.{i}", b"new")
            await prober.flush()
            wanted = CLIENTS * EACH // 10
            await eventually(lambda: len(inbox.events) >= wanted, timeout=60, what="the new subjects' events")
            assert sorted(inbox.events) == sorted(
                (f"churn.new.{c}.{i}", b"new") for c in range(CLIENTS) for i in range(0, EACH, 10)
            )
            assert (await link(cluster["b"], "a"))["events_out"] - out_before == wanted  # none on an old one
            assert (await link(cluster["b"], "a"))["connects"] == connects  # the link held through the churn
        finally:
            for client in (*holders, prober):
                await client.close()


async def _remote_patterns(cluster: MeshCluster, count: int) -> bool:
    return bool((await link(cluster["b"], "a"))["patterns_remote"] == count)
