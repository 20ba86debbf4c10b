"""One group commit of guaranteed events (:mod:`.guaranteed`): a batch appended to the spools and the
queues it goes to, one write per spool and per queue.

Everything per event here is the cheapest form of it: a spool's room is read once per batch and
counted down, an event id is made once, a queue remembers a batch's ids at once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from meshplane.core.mesh.vpn import vpn_of
from meshplane.core.streamlog import StoredEvent
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.queue_items import Queue, stored_event
from meshplane.mesh.spool import Spool
from meshplane.streams.errors import StorageError, StreamError

if TYPE_CHECKING:
    from meshplane.mesh.links import Link
    from meshplane.streams.durability import Syncable
    from meshplane.streams.service import StreamsService


def share_key(vpn: str, user: str) -> str:
    """What a spool counts a user's events under (its VPN's bytes are the sum of its keys': a NUL is
    in no VPN's or user's name)."""
    return f"{vpn}\0{user}"


# done(ticket, error): error "" once stored (and synced as the policy says), else why not
Answer = Callable[[int, str], None]


class VpnSpoolBytes(Protocol):
    """Each Message VPN's room in the node's spools (its ``max_spool_bytes``)."""

    def room(self, vpn: str) -> int | None:
        """Bytes ``vpn``'s events may still take in the spools (None: no limit)."""

    def refuse(self, vpn: str) -> str:
        """An event of ``vpn`` that does not fit: counted, and why."""

    def user_room(self, vpn: str, user: str) -> int | None:
        """Bytes the events ``user`` of ``vpn`` published on this node may still take (None: no limit)."""

    def refuse_user(self, vpn: str, user: str) -> str:
        """An event of ``user`` that does not fit: counted, and why."""


@dataclass(eq=False, slots=True)
class Work:
    """A guaranteed event waiting for the next commit."""

    event: MeshEvent | None  # None: a bad SPOOLED frame, confirmed in its turn
    spools: list[Spool]  # of peers, and of other clusters
    queues: list[Queue]
    done: Answer
    ticket: int  # what ``done`` is told the answer is for: a client's EVENT number, a spool offset
    way: str = ""  # how it came: "" published here, a peer's id (its spool), "@" + another cluster
    link: Link | None = None  # a spool's: the link it came over ...
    failures: int = 0  # ... and how many stores from that link had failed when it came
    user: str = ""  # published here by a client logged in as this user of its VPN


def store_batch(
    engine: StreamsService, batch: list[Work], counters: Counter[str], shares: VpnSpoolBytes | None = None
) -> tuple[dict[Work, str], set[Syncable], list[Spool]]:
    """Append a batch to spools and queues, one write per spool and per queue: the works that
    failed (and why), what must be synced before the others are acknowledged, and the spools that
    took events. A failed write fails the works it held; what they wrote elsewhere is dropped by id
    if they are sent again. An event published here past its VPN's room in the spools is refused
    (one that came from a spool is a peer's to hold: it is spooled on, counted), and one published
    past its user's room (each user's bytes are counted under ``VPN\0USER``: :func:`share_key`)."""
    failed: dict[Work, str] = {}
    by_spool: dict[Spool, list[bytes]] = {}
    vpns_of: dict[Spool, list[str]] = {}
    vpn_room: dict[str, int | None] = {}  # bytes each VPN may still spool, counted down
    vpn_by_subject: dict[str, str] = {}  # subjects repeat
    works_of: dict[Spool, list[Work]] = {}
    by_queue: dict[Queue, list[Work]] = {}
    room: dict[Spool, list[int]] = {}  # [events, bytes] each spool may still take
    for work in batch:
        event = work.event
        if event is None:
            continue
        if work.spools:
            raw = event.raw
            size = len(raw)
            full = None
            for spool in work.spools:
                left = room.get(spool) or room.setdefault(spool, spool.room())
                if left[0] < 1 or left[1] < size:
                    full = spool
                    break
            if full is not None:
                failed[work] = str(full.refuse())
                continue
            vpn = vpn_by_subject.get(event.subject) or vpn_by_subject.setdefault(
                event.subject, vpn_of(event.subject)
            )
            mine = (
                vpn_room.get(vpn)
                if vpn in vpn_room or shares is None
                else vpn_room.setdefault(vpn, shares.room(vpn))
            )
            if mine is not None:
                assert shares is not None
                taken = size * len(work.spools)
                if taken > mine and not work.way:
                    failed[work] = shares.refuse(vpn)
                    continue
                vpn_room[vpn] = mine - taken
            key = vpn
            if work.user and shares is not None:
                key = share_key(vpn, work.user)
                if key not in vpn_room:
                    vpn_room[key] = shares.user_room(vpn, work.user)
                own = vpn_room[key]
                if own is not None:
                    taken = size * len(work.spools)
                    if taken > own:
                        failed[work] = shares.refuse_user(vpn, work.user)
                        if mine is not None:
                            vpn_room[vpn] = mine  # not taken from the VPN's either
                        continue
                    vpn_room[key] = own - taken
            for spool in work.spools:
                left = room[spool]
                left[0] -= 1
                left[1] -= size
                by_spool.setdefault(spool, []).append(raw)
                vpns_of.setdefault(spool, []).append(key)
                works_of.setdefault(spool, []).append(work)
        for queue in work.queues:
            by_queue.setdefault(queue, []).append(work)
    synced: set[Syncable] = set()
    appended: list[Spool] = []
    for spool, raws in by_spool.items():
        try:
            spool.append(raws, vpns_of[spool])
            synced.add(spool.log)
            appended.append(spool)
        except StorageError as exc:
            failed.update((work, str(exc)) for work in works_of[spool])
    for queue, works in by_queue.items():
        _store_in(engine, queue, works, failed, synced, counters)
    return failed, synced, appended


def _store_in(
    engine: StreamsService,
    queue: Queue,
    works: list[Work],
    failed: dict[Work, str],
    synced: set[Syncable],
    counters: Counter[str],
) -> None:
    """A batch's events for one queue, but those it stored already (by the spool offset of their
    source, or by event id)."""
    recent = queue.recent.ids
    marks = queue.marks
    fresh: dict[str, Work] = {}
    events: list[StoredEvent] = []
    for work in works:
        if failed and work in failed:
            continue
        event = work.event
        assert event is not None
        event_id = f"{event.timestamp_ms}-{event.sequence}-{event.source}"  # MeshEvent.event_id
        way = work.way  # a spool's: ``ticket`` is the offset there
        if event_id in recent or event_id in fresh or (way and marks.seen(way, work.ticket)):
            queue.duplicates += 1
            counters["duplicates_dropped"] += 1
        else:
            fresh[event_id] = work
            events.append(stored_event(event, event_id, way, work.ticket))
    if not fresh:
        return
    try:
        if queue.name not in engine.topics:  # deleted under the queue: made again, held if paused
            engine.topic_store.create(queue.name, 1).held = queue.paused
        places, more = engine.append_topic(queue.name, events)
    except StreamError as exc:
        failed.update((work, str(exc)) for work in fresh.values())
        return
    synced.update(more)
    ways: dict[str, list[str]] = {}
    now_ms = time.time_ns() // 1_000_000
    for event_id, work in fresh.items():
        ways.setdefault(work.way, []).append(event_id)
        if work.way:
            marks.stored(work.way, work.ticket, now_ms)
    at = {event_id: offset for event_id, (_, offset) in zip(fresh, places, strict=True)}
    for way, event_ids in ways.items():
        queue.recent.remember(event_ids, way, [at[event_id] for event_id in event_ids] if not way else ())
    queue.stored += len(fresh)
