"""What one queue holds in memory (:mod:`.queues` keeps them): the ids of the events it stored last,
its marks of what it stored from each spool, and how an event is stored in its topic."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import msgspec

from meshplane.core.doors.nats_protocol import NOT_WRAPPED, looks_wrapped
from meshplane.core.mesh.frames import FLAG_JSON_MESSAGE, FLAG_NATS_ENVELOPE
from meshplane.core.mesh.source_marks import SourceMarks
from meshplane.core.mesh.vpn import DEFAULT, outward, prefix_of, vpn_of
from meshplane.core.streamlog import StoredEvent
from meshplane.mesh.holders import MeshEvent

RECENT_IDS = 50_000  # event ids a queue remembers per way in (more than a spool's resends reach back)


class RecentIds:
    """The event ids a queue stored last, RECENT_IDS for each way they came in: this node's
    publishers (``""``), each peer's spool, each other cluster's. A resend (a link that starts over, a
    mate's stale confirmed offset after a power loss) comes the way its first copy did and reaches back
    a bounded number of that way's events, however busy the other ways were meanwhile. A set to ask,
    each way's order to forget its oldest (an OrderedDict did both at three times the cost)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self._order: dict[str, deque[str]] = {}  # by way
        self._local_at: deque[int] = deque()  # the topic offsets of way ``""``'s ids, in their order

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def local_from(self) -> int | None:
        """Where the topic holds the oldest id remembered of this node's publishers (None: none)."""
        return self._local_at[0] if self._local_at else None

    def remember(self, event_ids: Collection[str], way: str = "", offsets: Collection[int] = ()) -> None:
        """``event_ids``: new ids, each once (the caller asked ``ids``), that came in ``way``;
        ``offsets``: where the topic holds them (kept for way ``""``)."""
        ids = self.ids
        order = self._order.get(way)
        if order is None:
            order = self._order[way] = deque()
        ids.update(event_ids)
        order.extend(event_ids)
        for _ in range(len(order) - RECENT_IDS):
            ids.discard(order.popleft())
        if not way:
            self._local_at.extend(offsets)
            for _ in range(len(self._local_at) - len(order)):
                self._local_at.popleft()


@dataclass(eq=False)
class Queue:
    """A guaranteed subscription: a holder of ``$G.`` patterns in the router."""

    name: str  # its topic's: ``VPN:NAME`` beyond the default VPN
    patterns: list[str]  # with its VPN's prefix
    recent: RecentIds = field(default_factory=RecentIds)
    marks: SourceMarks = field(default_factory=SourceMarks)
    stored: int = 0
    duplicates: int = 0
    paused: bool = False  # stores, but its topic's readers get nothing

    def deliver(self, event: MeshEvent) -> None:
        """Queues take events only through :class:`Guaranteed` (stored, then acknowledged)."""


def stored_event(
    event: MeshEvent, event_id: str | None = None, source: str = "", offset: int = 0
) -> StoredEvent:
    """How a queue's topic keeps an event: pub/sub messages by their payload, others as bytes; one
    that came from a spool says which (``via``) and at what offset (``via_offset``)."""
    data: Any = event.body
    if event.flags & FLAG_JSON_MESSAGE:
        with contextlib.suppress(msgspec.DecodeError, AttributeError, TypeError):
            data = msgspec.json.decode(event.body).get("payload")
    vpn = vpn_of(event.subject)
    subject = outward(prefix_of(vpn), event.subject)  # as the VPN's clients published it
    metadata = {"subject": subject, "origin": event.source}
    if vpn != DEFAULT:
        metadata["vpn"] = vpn
    if source:
        metadata["via"], metadata["via_offset"] = source, str(offset)
    if not event.flags & (FLAG_NATS_ENVELOPE | FLAG_JSON_MESSAGE) and looks_wrapped(event.body):
        metadata[NOT_WRAPPED] = "1"
    return StoredEvent(
        id=event.event_id if event_id is None else event_id,
        event_type=subject,
        data=data,
        key=event.source,
        metadata=metadata,
    )
