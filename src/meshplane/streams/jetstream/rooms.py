"""Rooms on JetStream: one stream per room, settings in a replicated key-value bucket.

Every server keeps each room's recent history in memory (reads, replays and pushes are served from
it, as on the local backend) and follows the room's stream: the stream republishes every event it
stored, whole, to one feed subject that all servers subscribe to. An event is applied when it is the
next offset the view expects; anything else (a feed message lost to a slow subscription, an event
published before this server saw the room) makes the view catch up from the stream with batched
direct gets, so every server's history is the stream's, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from meshplane.core.streamlog import Record, StoredEvent
from meshplane.streams.config import now_ms
from meshplane.streams.errors import BadRequest, Conflict, StorageError
from meshplane.streams.events import StreamEvent, decode_stream_event
from meshplane.streams.jetstream import naming
from meshplane.streams.jetstream.store import JetStreamStore, StreamBounds, Unavailable
from meshplane.streams.rooms import Room

log = logging.getLogger(__name__)

# How long a publisher waits for its event to reach this server's view through the feed before
# asking the stream for it (the feed normally delivers it with the acknowledgement).
FEED_GRACE_SECS = 0.5
READ_BYTES = 8 << 20


class RoomSettings(msgspec.Struct, frozen=True):
    max_events: int
    retention_secs: float | None
    created_at: float
    incarnation: str


class SharedRoom(Room):
    """A room whose events are stored in a JetStream stream; this is one server's view of it."""

    def __init__(self, name: str, settings: RoomSettings, max_bytes: Callable[[], int]) -> None:
        super().__init__(name, settings.max_events, settings.retention_secs, settings.created_at, max_bytes)
        self.incarnation = settings.incarnation
        self.bounds = StreamBounds()
        self.stored_end = 0  # the stream holds events up to here (what the view must reach)
        self.catching_up: asyncio.Task[None] | None = None

    @property
    def stored_bytes(self) -> int:
        return self.bounds.bytes


class SharedRooms:
    """The rooms' views on this server, and every change made through JetStream."""

    def __init__(
        self,
        store: JetStreamStore,
        rooms: dict[str, Room],
        counters: dict[str, int],
        byte_limit: Callable[[], int],
    ) -> None:
        self.store = store
        self.rooms = rooms  # the service's
        self.counters = counters
        self.byte_limit = byte_limit

    def _shared(self, name: str) -> SharedRoom | None:
        room = self.rooms.get(name)
        return room if isinstance(room, SharedRoom) else None

    # --- following ------------------------------------------------------------------------------------

    def seen(self, key: str, value: bytes | None) -> None:
        """A watched change of the rooms' bucket (from any server)."""
        name = naming.unescape(key)
        known = self._shared(name)
        if value is None:
            if known is not None:
                self._forget(known)
            return
        try:
            settings = msgspec.json.decode(value, type=RoomSettings)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("room %s: unreadable settings in JetStream (%s)", name, exc)
            return
        if known is not None and known.incarnation == settings.incarnation:
            return
        if known is not None:  # deleted and made again meanwhile
            self._forget(known)
        room = SharedRoom(name, settings, self.byte_limit)
        self.rooms[name] = room
        self.catch_up(room)

    def _forget(self, room: SharedRoom) -> None:
        if self.rooms.get(room.name) is room:
            del self.rooms[room.name]
        if room.catching_up is not None:
            room.catching_up.cancel()
        room.ended()

    async def on_event(self, msg: Msg) -> None:
        """An event a room's stream stored (republished by JetStream, from whichever server)."""
        name = self.store.naming.parse_room_feed(msg.subject)
        room = self._shared(name) if name is not None else None
        headers = msg.headers or {}
        sequence = headers.get("Nats-Sequence")
        if room is None or sequence is None or not sequence.isdigit():
            return
        offset = int(sequence) - 1
        if offset == room.next_offset:
            self._apply(room, [_record(offset, headers, msg.data)])
        elif offset >= room.next_offset:
            room.stored_end = max(room.stored_end, offset + 1)
            self.catch_up(room)

    def catch_up(self, room: SharedRoom) -> None:
        """Read what the view is missing from the stream (one reader per room at a time)."""
        if room.catching_up is None or room.catching_up.done():
            room.catching_up = asyncio.get_running_loop().create_task(self._catch_up(room))

    async def _catch_up(self, room: SharedRoom) -> None:
        stream = self.store.naming.room_stream(room.name)
        try:
            room.bounds = await self.store.stream_bounds(stream)
            room.stored_end = max(room.stored_end, room.bounds.next_offset)
            while room.next_offset < room.stored_end and self.rooms.get(room.name) is room:
                records = await self.store.read_stream(stream, room.next_offset, 1000, READ_BYTES)
                records = [r for r in records if r.offset >= room.next_offset]
                if not records:  # all removed by the stream's limits meanwhile: start at its end
                    room.next_offset = max(room.next_offset, room.stored_end)
                    break
                self._apply(room, records)
        except (StorageError, nats.errors.Error, nats.js.errors.Error) as exc:
            log.warning("room %s: catching up with JetStream failed (%s); retried on upkeep", room.name, exc)
        finally:
            room.catching_up = None
        room.notifier.notify()

    def _apply(self, room: SharedRoom, records: list[Record]) -> None:
        now = now_ms()
        for record in records:
            try:
                event = decode_stream_event(record)
            except (ValueError, msgspec.DecodeError) as exc:  # put there by something not meshplane
                self.counters["room_events_unreadable"] += 1
                log.error("room %s: event %d is unreadable (%s): skipped", room.name, record.offset, exc)
                room.restart_at(record.offset + 1)  # the history stays contiguous
                continue
            room.add([event], now)
            room.broadcast(event)
        room.stored_end = max(room.stored_end, room.next_offset)

    async def caught_up(self, name: str) -> SharedRoom | None:
        """The room's view holding every event its stream stored before this call (an event
        acknowledged through another server included), or None when the bucket has no such room."""
        room = self._shared(name)
        if room is None:  # made through another server, its settings not heard of yet
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                entry = await self.store.rooms_kv.get(naming.escape(name))
                self.seen(entry.key, entry.value)
            room = self._shared(name)
            if room is None:
                return None
        with contextlib.suppress(Unavailable, nats.js.errors.NotFoundError):
            room.bounds = await self.store.stream_bounds(self.store.naming.room_stream(room.name))
            end = room.bounds.next_offset
            if end > room.next_offset:
                room.stored_end = max(room.stored_end, end)
                self.catch_up(room)
                await self._reached(room, end - 1, self.store.timeout)
        return room

    async def refresh(self) -> None:
        """What the feed may not have said (lost messages, the limits' removals): each room's bounds."""
        for room in list(self.rooms.values()):
            if isinstance(room, SharedRoom) and room.catching_up is None:
                with contextlib.suppress(Unavailable, nats.js.errors.NotFoundError):
                    room.bounds = await self.store.stream_bounds(self.store.naming.room_stream(room.name))
                    if room.bounds.next_offset > room.next_offset:
                        room.stored_end = room.bounds.next_offset
                        self.catch_up(room)

    async def settle(self) -> None:
        """Wait for every room's first catch-up (at start, before the server answers)."""
        pending = [r.catching_up for r in self.rooms.values() if isinstance(r, SharedRoom) and r.catching_up]
        await asyncio.gather(*pending, return_exceptions=True)

    def close(self) -> None:
        for room in self.rooms.values():
            if isinstance(room, SharedRoom) and room.catching_up is not None:
                room.catching_up.cancel()

    # --- changes --------------------------------------------------------------------------------------

    async def create(
        self, name: str, max_events: int, retention_secs: float | None, exist_ok: bool
    ) -> tuple[Room, bool]:
        if len(self.store.naming.room_stream(name)) > naming.MAX_STREAM_NAME:
            raise BadRequest(f"room name {name!r} is too long for a JetStream stream name")
        settings = RoomSettings(max_events, retention_secs, now_ms() / 1000, uuid.uuid4().hex)
        # The stream first: a room whose settings are seen has its stream.
        await self.store.ensure_room(name, max_events, retention_secs)
        key = naming.escape(name)
        try:
            await self.store.rooms_kv.create(key, msgspec.json.encode(settings))
        except nats.js.errors.KeyWrongLastSequenceError:
            if not exist_ok:
                raise Conflict(f"room {name!r} already exists") from None
            entry = await self.store.rooms_kv.get(key)  # made through another server just now
            self.seen(key, entry.value)
            return self.rooms[name], False
        except nats.errors.TimeoutError:
            raise Unavailable(f"JetStream did not store room {name!r}") from None
        self.seen(key, msgspec.json.encode(settings))
        return self.rooms[name], True

    async def delete(self, name: str) -> bool:
        key = naming.escape(name)
        try:
            await self.store.rooms_kv.get(key)
            existed = True
        except nats.js.errors.KeyNotFoundError:
            existed = False
        if existed:
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                await self.store.rooms_kv.delete(key)
            await self.store.delete_stream(self.store.naming.room_stream(name))
        known = self._shared(name)  # a view of a room the bucket no longer lists goes too
        if known is not None:
            self._forget(known)
        return existed

    async def publish(self, room: SharedRoom, body: StoredEvent, payload: bytes) -> StreamEvent:
        """Acknowledged once the room's stream stored it (on a quorum of its replicas); the event as
        this server's view holds it, once the view has reached it."""
        timestamp = now_ms()
        offsets, _ = await self.store.publish(self.store.naming.room_subject(room.name), [payload], timestamp)
        offset = offsets[0]
        room.published += 1
        room.stored_end = max(room.stored_end, offset + 1)
        if not await self._reached(room, offset, FEED_GRACE_SECS):
            self.catch_up(room)
            await self._reached(room, offset, self.store.timeout)
        if room.oldest <= offset < room.next_offset:
            return room.read(offset, 1)[0]
        return StreamEvent(offset, timestamp, body)  # trimmed already, or the view is behind

    async def _reached(self, room: SharedRoom, offset: int, timeout: float) -> bool:
        waiter = room.notifier.waiter()
        try:
            async with asyncio.timeout(timeout):
                while room.next_offset <= offset and self.rooms.get(room.name) is room:
                    waiter.clear()
                    await waiter.wait()
        except TimeoutError:
            return False
        finally:
            room.notifier.forget(waiter)
        return True


def _record(offset: int, headers: dict[str, str], data: bytes) -> Record:
    stamp = headers.get(naming.TIMESTAMP_HEADER, "0")
    return Record(offset, int(stamp) if stamp.isdigit() else 0, data, 0, len(data))
