"""A link whose peer stops reading: past the link's buffer (64 MiB) events to it are dropped and counted
as ``dropped_backpressure`` (docs/mesh.md), the node keeps serving, and what was kept arrives in order
once the peer reads again."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.mesh import Inbox, interest_reached, link, status
from tests.support.processes import stopped

BODY = 256 * 1024
EVENTS = 400  # 100 MiB: past the 64 MiB a link may hold


async def test_a_peer_that_stops_reading_costs_its_link_events_not_the_node() -> None:
    # Heartbeats every 5 s: the paused peer is declared dead only after 17.5 s of silence.
    with MeshCluster(2, heartbeat_interval=5).start() as cluster:
        await asyncio.to_thread(cluster.wait_linked)
        a = await MeshClient(cluster["a"].route_url).connect()
        b = await MeshClient(cluster["b"].route_url, timeout=30).connect()
        try:
            inbox = Inbox()
            b.subscribe("bp.>", inbox)
            await b.flush()
            await interest_reached(cluster["a"], "b", "bp.>")
            pid = cluster["b"].pid
            assert pid is not None
            cluster["b"].kill(signal.SIGSTOP)
            await eventually(lambda: stopped(pid), what="b stopped")
            for i in range(EVENTS):
                await a.publish("bp.x", i.to_bytes(4, "big") + b"\0" * (BODY - 4))
            await a.flush()
            to_b = await link(cluster["a"], "b")
            assert (to_b["state"], to_b["dead_peer_timeouts"]) == ("up", 0), (
                "b's link closed: nothing measured"
            )
            dropped = to_b["dropped_backpressure"]
            assert 0 < dropped < EVENTS, to_b
            assert to_b["events_out"] == EVENTS - dropped
            assert (await status(cluster["a"]))["links"]  # a still answers while b's link is full
            cluster["b"].kill(signal.SIGCONT)
            kept = EVENTS - dropped
            await eventually(lambda: len(inbox.events) == kept, timeout=60, what=f"the {kept} kept at b")
            assert [int.from_bytes(body[:4], "big") for _, body in inbox.events] == list(range(kept))
        finally:
            with contextlib.suppress(ProcessLookupError):
                cluster["b"].kill(signal.SIGCONT)
            await a.close()
            await b.close()
