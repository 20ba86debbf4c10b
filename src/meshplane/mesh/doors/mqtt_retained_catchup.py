"""Retained messages for a peer whose link just came up: what this node holds (tombstones included, so
a clear made while the peer was away wins there too), sent over that link only as the same ``$mqtt.``
events a retained PUBLISH makes, to the peers that want them (a door on each: its interest in
``$mqtt.``), a slice per turn of the loop and never past half the link's buffer. Both ends of a new
link send, so a node started later learns what its cluster holds, and, over a gateway, what the other
cluster's gateway node holds (which it spreads in its cluster as any event from there). What the peer
keeps is its own checks' business (:meth:`RetainedStore.learn`): a lying peer gets no further here
than with a live event."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_topics import RETAIN_PREFIX
from meshplane.mesh.links import Link

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt_retained import RetainHolder

SLICE = 256  # records per turn of the loop
DRAIN_POLL = 0.01  # seconds between looks at a full link buffer
DRAIN_POLLS = 3000  # looks (30 s) before a catch-up to a peer that reads nothing is given up


async def send_catch_up(holder: RetainHolder, link: Link) -> None:
    """Stops when the link goes down (coming up again starts another); a connection swapped under an
    up link (the pair keeping the other of two) carries the rest."""
    node = holder.door.node
    records = list(holder.door.retained.table.records())  # what changes meanwhile travels live anyway
    gateway = getattr(link, "holder", None)  # a gateway link's: the other cluster's interest
    sent = 0
    for start in range(0, len(records), SLICE):
        for _ in range(DRAIN_POLLS):
            conn = link.conn
            if conn is None or conn.buffered_bytes() <= node.config.link_buffer_bytes // 2:
                break
            await asyncio.sleep(DRAIN_POLL)
        else:  # the peer reads nothing: what it missed comes with its link's next coming up
            holder.door.counters["retained_catch_up_stalled"] += 1
            return
        if link.state != "up" or conn is None:
            return
        for record in records[start : start + SLICE]:
            route = node.router.route(RETAIN_PREFIX + record.subject)
            if gateway in route.local if link.external else link.peer in route.peers:
                conn.send(holder.event(record).raw)
                sent += 1
        await asyncio.sleep(0)
    holder.door.counters["retained_catch_up_sent"] += sent
