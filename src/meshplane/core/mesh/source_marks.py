"""The last spool offset a queue stored from each source, as Kafka's idempotent producer keeps the last
sequence per producer: a resend from any point is known, whatever other sources sent in between.

A source is a way events come into a queue with offsets that only grow: a peer's spool for this node
(``peer``), or another cluster's gateway spool (``@cluster``). Each source's events reach the queue in
offset order (a link delivers its spool in order, and a failed store stops everything after it from
that link until the link starts over), so an event is a resend exactly when its offset is at or below
the last one stored from its source. Spool offsets never start over: a new spool starts from the
clock in microseconds (:mod:`meshplane.mesh.spool`), above anything an earlier spool of the same
peer used.

Bounded by the number of sources: beyond ``max_sources`` the one that stored least recently is
forgotten (a peer gone for good). Time is passed in.

The checkpoint also says where the queue's topic holds the oldest id it remembers of the events
published on its node (``local_from``): those have no offsets of their own (a client's retry is
known by its id), and a restart reads their ids back from there.
"""

from __future__ import annotations

import msgspec

MAX_SOURCES = 10_000  # per queue


class _Saved(msgspec.Struct, frozen=True):
    """A queue's marks as checkpointed: valid for the queue's topic up to ``next_offset``."""

    next_offset: int
    sources: dict[str, tuple[int, int]]  # source: (last offset stored, when, in ms)
    local_from: int | None = None  # the topic offset of the oldest id of this node's events remembered


class SourceMarks:
    def __init__(self, max_sources: int = MAX_SOURCES) -> None:
        self.max_sources = max_sources
        self._marks: dict[str, tuple[int, int]] = {}  # in order of their last store, oldest first
        self.changed = False
        self.local_from: int | None = None  # as checkpointed (see the module's docstring)

    def __len__(self) -> int:
        return len(self._marks)

    def last(self, source: str) -> int:
        """The last offset stored from ``source``; -1 if none is remembered."""
        mark = self._marks.get(source)
        return -1 if mark is None else mark[0]

    def seen(self, source: str, offset: int) -> bool:
        """True when the event at ``offset`` of ``source`` was stored already (a resend)."""
        mark = self._marks.get(source)
        return mark is not None and offset <= mark[0]

    def stored(self, source: str, offset: int, now_ms: int) -> None:
        """The event at ``offset`` of ``source`` is stored (offsets of one source come in order)."""
        mark = self._marks.pop(source, None)
        self._marks[source] = (offset if mark is None else max(mark[0], offset), now_ms)
        self.changed = True
        while len(self._marks) > self.max_sources:
            del self._marks[next(iter(self._marks))]

    def encode(self, next_offset: int, local_from: int | None = None) -> bytes:
        """The marks as a checkpoint valid for the topic up to ``next_offset``."""
        self.local_from = local_from
        return msgspec.json.encode(_Saved(next_offset, self._marks, local_from))

    def load(self, raw: bytes, next_offset: int) -> int | None:
        """Take a checkpoint; the topic offset to replay from, or None if it does not fit a topic that
        ends at ``next_offset`` (unreadable, or newer than the topic: its tail was lost)."""
        try:
            saved = msgspec.json.decode(raw, type=_Saved)
        except msgspec.DecodeError:
            return None
        if saved.next_offset > next_offset or saved.next_offset < 0:
            return None
        newest = sorted(saved.sources.items(), key=lambda item: item[1][1])[-self.max_sources :]
        self._marks = dict(newest)
        self.local_from = saved.local_from
        return saved.next_offset
