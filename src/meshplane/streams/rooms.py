"""Rooms: a log plus an in-memory ring of the most recent events (Synap's event streams)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from meshplane.core import streamlog
from meshplane.core.streamlog import RetentionPolicy, StoredEvent, resolve_start_offset
from meshplane.streams.config import StreamsConfig, now_ms
from meshplane.streams.errors import BadRequest, CorruptRecords, LimitReached, storage_error
from meshplane.streams.events import Notifier, StreamEvent, decode_stream_event
from meshplane.streams.files import FilePool, write_atomic
from meshplane.streams.log import PartitionLog


class Pusher(Protocol):
    def offer(self, event: StreamEvent) -> bool: ...

    def wake(self) -> None: ...


class Room:
    """A room as this server serves it: an in-memory ring of its most recent events (the retained
    history, read by offset arithmetic) and its live subscribers. Where the events are stored is the
    subclass's: :class:`LocalRoom` keeps a log on this host's disk; a JetStream room, a stream."""

    def __init__(
        self,
        name: str,
        max_events: int,
        retention_secs: float | None,
        created_at: float,
        max_bytes: Callable[[], int] = lambda: 1 << 62,
    ) -> None:
        self.name = name
        self.max_events = max_events
        self.retention_secs = retention_secs
        self.created_at = created_at
        self.max_bytes = max_bytes  # the in-memory history's byte bound, which shrinks as rooms are added
        self.notifier = Notifier()  # long polls and other waiters
        self.pushers: set[Pusher] = set()  # WebSocket / SSE subscribers
        self.subscribers: dict[str, float] = {}  # subscriber id -> last seen
        self._ring: list[StreamEvent] = []
        self._head = 0
        self.ring_bytes = 0  # of the events from _head on
        self.next_offset = 0
        self.last_event_at: float | None = None
        self.published = 0

    def settings(self) -> dict[str, Any]:
        return {
            "max_events": self.max_events,
            "retention_secs": self.retention_secs,
            "created_at": self.created_at,
        }

    def stats(self) -> dict[str, Any]:
        oldest, nxt = self.oldest, self.next_offset
        return {
            "name": self.name,
            "room": self.name,
            "message_count": len(self),
            "min_offset": oldest,
            "max_offset": nxt - 1 if nxt > oldest else None,
            "next_offset": nxt,
            "subscriber_count": len(self.subscribers),
            "live_subscribers": len(self.pushers),
            "published": self.published,
            "max_events": self.max_events,
            "retention_secs": self.retention_secs,
            "total_bytes": self.stored_bytes,
            "created_at": self.created_at,
            "last_event_at": self.last_event_at,
        }

    def idle_for(self, now: float) -> float:
        """Seconds since its last event (or creation) with nobody subscribed; 0 while anyone is."""
        if self.pushers or self.subscribers:
            return 0.0
        return now - (self.last_event_at or self.created_at)

    def touch_subscriber(self, subscriber_id: str, limit: int) -> None:
        """A subscriber id seen now; a new one past ``limit`` is refused."""
        if subscriber_id not in self.subscribers and len(self.subscribers) >= limit:
            raise LimitReached(f"room {self.name!r} has {limit} subscribers (the limit)", "room_subscribers")
        self.subscribers[subscriber_id] = time.time()

    @property
    def stored_bytes(self) -> int:
        return self.ring_bytes

    @property
    def problems(self) -> list[str]:
        return []

    @property
    def problems_total(self) -> int:
        return 0

    def expire(self, now: int) -> None:
        """Drop what the room's limits no longer keep (called periodically)."""
        self.trim(now)

    def close(self) -> None:
        pass

    @property
    def oldest(self) -> int:
        return self._ring[self._head].offset if self._head < len(self._ring) else self.next_offset

    def __len__(self) -> int:
        return len(self._ring) - self._head

    def last_event_ms(self) -> int:
        return self._ring[-1].timestamp_ms if self._ring else 0

    def add(self, events: list[StreamEvent], now: int) -> None:
        """Events stored from ``next_offset`` on, in order. When the first one lies past it (those in
        between were removed before they were read), the history restarts there: reads count on
        the ring being contiguous."""
        if not events:
            return
        if events[0].offset != self.next_offset:
            self.restart_at(events[0].offset)
        for event in events:
            self._ring.append(event)
            self.ring_bytes += event.size
        self.next_offset = events[-1].offset + 1
        self.last_event_at = events[-1].timestamp_ms / 1000
        self.trim(now)

    def restart_at(self, offset: int) -> None:
        """The history holds nothing before ``offset`` (a hole: removed or unreadable events)."""
        self._ring.clear()
        self._head = 0
        self.ring_bytes = 0
        self.next_offset = offset

    def broadcast(self, event: StreamEvent) -> int:
        """Hand a new event to pushed subscribers; returns how many were written at once."""
        written = 0
        for pusher in list(self.pushers):
            if pusher.offer(event):
                written += 1
            else:
                pusher.wake()
        self.notifier.notify()
        return written

    def ended(self) -> None:
        """The room was deleted: waiters and pushed subscribers see it is gone."""
        self.notifier.notify()
        for pusher in self.pushers:
            pusher.wake()

    def trim(self, now: int) -> None:
        """Keep at most max_events and max_bytes (but the newest event), none older than retention_secs."""
        head = self._head
        while len(self._ring) - head > self.max_events:
            self.ring_bytes -= self._ring[head].size
            head += 1
        cutoff = now - self.retention_secs * 1000 if self.retention_secs is not None else None
        limit = self.max_bytes()
        while head < len(self._ring) - 1 and (
            self.ring_bytes > limit or (cutoff is not None and self._ring[head].timestamp_ms < cutoff)
        ):
            self.ring_bytes -= self._ring[head].size
            head += 1
        if head == len(self._ring) - 1 and cutoff is not None and self._ring[head].timestamp_ms < cutoff:
            self.ring_bytes -= self._ring[head].size
            head += 1
        self._head = head
        if self._head > 1024 and self._head * 2 > len(self._ring):
            del self._ring[: self._head]
            self._head = 0

    def read(self, from_offset: int, limit: int, to_offset: int | None = None) -> list[StreamEvent]:
        """Events from ``from_offset`` (already resolved and checked) on, up to ``to_offset`` inclusive."""
        start = self._head + (from_offset - self.oldest)
        stop = start + limit
        if to_offset is not None:
            stop = min(stop, self._head + (to_offset - self.oldest) + 1)
        return self._ring[max(start, self._head) : max(stop, start)]

    def resolve(self, from_offset: int | None) -> int:
        return resolve_start_offset(from_offset, self.oldest, self.next_offset)


class LocalRoom(Room):
    """A room whose events are stored in a log in its own folder of the data directory."""

    def __init__(
        self,
        name: str,
        directory: Path,
        max_events: int,
        retention_secs: float | None,
        segment_bytes: int,
        created_at: float,
        files: FilePool | None = None,
        max_bytes: Callable[[], int] = lambda: 1 << 62,
    ) -> None:
        super().__init__(name, max_events, retention_secs, created_at, max_bytes)
        self.directory = directory
        self.log = PartitionLog(
            directory,
            segment_bytes=segment_bytes,
            retention=RetentionPolicy(max_messages=max_events),
            files=files,
        )
        self._reload()

    def _reload(self) -> None:
        start = self.log.start_offset
        while start < self.log.next_offset:
            try:
                records = self.log.read(start, 10_000, 16 << 20)
            except CorruptRecords as exc:
                start = exc.next_offset  # add() restarts the history after the hole
                continue
            if not records:
                break
            self.add([decode_stream_event(r) for r in records], now_ms())
            start = records[-1].offset + 1
        if self.next_offset != self.log.next_offset:  # the log's tail was unreadable or removed
            self.restart_at(self.log.next_offset)

    @property
    def stored_bytes(self) -> int:
        return self.log.size_bytes

    @property
    def problems(self) -> list[str]:
        return self.log.problems

    @property
    def problems_total(self) -> int:
        return self.log.problems_total

    def expire(self, now: int) -> None:
        self.trim(now)
        self.log.apply_retention(now, keep_from=self.oldest)

    def set_limits(self, max_events: int, retention_secs: float | None, now: int) -> None:
        """New limits (checked by the caller): saved in ``room.json``, then applied."""
        settings = self.settings() | {"max_events": max_events, "retention_secs": retention_secs}
        try:
            write_atomic(self.directory / "room.json", json.dumps(settings).encode())
        except OSError as exc:
            raise storage_error(exc, f"changing the retention of room {self.name!r}") from exc
        self.max_events, self.retention_secs = max_events, retention_secs
        self.log.retention = RetentionPolicy(max_messages=max_events)
        self.expire(now)

    def close(self) -> None:
        self.log.sync()
        self.log.close()

    def append(self, events: list[StoredEvent], payloads: list[bytes], timestamp_ms: int) -> int:
        first = self.log.append(payloads, timestamp_ms)
        self.add(
            [
                StreamEvent(first + i, timestamp_ms, event, len(payload) + streamlog.HEADER_SIZE)
                for i, (event, payload) in enumerate(zip(events, payloads, strict=True))
            ],
            timestamp_ms,
        )
        self.published += len(events)
        return first


def read_room_settings(
    directory: Path,
    defaults: tuple[int, float | None, float],
    report: Callable[[str], None],
    set_aside: Callable[[Path, str], None],
) -> tuple[int, float | None, float] | None:
    """A room's (max_events, retention_secs, created_at) from its ``room.json``: ``defaults`` where it
    is missing (reported) or unreadable (set aside); None for a folder with no room left in it."""
    path = directory / "room.json"
    max_events, retention_secs, created_at = defaults
    try:
        settings = json.loads(path.read_bytes())
        if not isinstance(settings, dict):
            raise ValueError("not an object")
        return (
            int(settings["max_events"]),
            settings.get("retention_secs", retention_secs),
            float(settings.get("created_at") or created_at),
        )
    except FileNotFoundError:
        if not any(directory.glob("*.log")):
            return None
        report(f"room {directory.name}: room.json is missing; defaults used")
    except (ValueError, KeyError, TypeError) as exc:
        set_aside(path, f"room {directory.name}: room.json is unreadable ({exc}); defaults used")
    return max_events, retention_secs, created_at


def room_settings(
    config: StreamsConfig, max_events: int | None, retention_secs: float | None
) -> tuple[int, float | None]:
    """A new room's (max_events, retention_secs): the server's defaults for what is not given."""
    max_events = config.room_max_events if max_events is None else max_events
    most = config.room_max_events_limit
    if isinstance(max_events, bool) or not isinstance(max_events, int) or not 1 <= max_events <= most:
        raise BadRequest(f"max_events must be an integer in 1..{most}, not {max_events!r}")
    return max_events, config.room_retention_secs if retention_secs is None else retention_secs
