"""Pushing a room's events to WebSocket and SSE subscribers, and the WebSocket frame helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from collections.abc import Callable
from typing import Any, cast

from aiohttp import WSMsgType, web

from meshplane.streams.errors import (
    OffsetOutOfRange,
)
from meshplane.streams.events import StreamEvent
from meshplane.streams.rooms import Room
from meshplane.streams.service import StreamsService


class RoomPusher:
    """One pushed subscriber (WebSocket or SSE) of a room.

    A publish offers each new event to every pusher; a caught-up pusher whose socket is not backed
    up gets the event's prebuilt frame written to its transport at once, in the publisher's turn
    (no await, no task wake-up per subscriber). Others are woken and catch up from the room's ring
    in their own task, in order.
    """

    BACKLOG_LIMIT = 1 << 20

    def __init__(
        self,
        out: web.StreamResponse,
        transport: asyncio.BaseTransport | None,
        room: Room,
        cursor: int,
        render: Callable[[StreamEvent], bytes],
        wire: Callable[[StreamEvent], bytes] | None,
        engine: StreamsService,
    ) -> None:
        self.out, self.room, self.cursor = out, room, cursor
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.WriteTransport | None, transport)
        self.render, self.wire, self.engine = render, wire, engine
        self.lock = asyncio.Lock()
        self.wakeup = asyncio.Event()

    async def _send(self, event: StreamEvent) -> None:
        frame = self.render(event)
        if isinstance(self.out, web.WebSocketResponse):
            await self.out.send_frame(frame, WSMsgType.TEXT)  # already UTF-8 JSON
        else:
            await self.out.write(frame)

    def offer(self, event: StreamEvent) -> bool:
        transport = self.transport
        if (
            self.wire is None
            or self.lock.locked()  # catching up in its own task: it will reach this event in order
            or event.offset != self.cursor
            or transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size() > self.BACKLOG_LIMIT
        ):
            return False
        transport.write(self.wire(event))
        self.cursor += 1
        return True

    def wake(self) -> None:
        self.wakeup.set()

    async def run(self, closed: asyncio.Event, subscriber: str | None) -> None:
        room = self.room
        while not closed.is_set():
            self.wakeup.clear()
            if self.engine.rooms.get(room.name) is not room:
                await send_error(self.out, f"room {room.name!r} was deleted")
                return
            async with self.lock:
                if self.cursor < room.oldest:
                    await send_error(
                        self.out, str(OffsetOutOfRange(self.cursor, room.oldest, room.next_offset - 1))
                    )
                    return
                events = room.read(self.cursor, 1000)
                for event in events:
                    await self._send(event)
                    self.cursor = event.offset + 1
            if events:
                if subscriber is not None:
                    room.subscribers[subscriber] = time.time()
                continue
            woken = asyncio.ensure_future(self.wakeup.wait())
            close_wait = asyncio.ensure_future(closed.wait())
            done, _ = await asyncio.wait(
                {woken, close_wait},
                timeout=self.engine.config.push_keepalive_secs,
                return_when=asyncio.FIRST_COMPLETED,
            )
            woken.cancel()
            close_wait.cancel()
            if not done:
                await self._keepalive()

    async def _keepalive(self) -> None:
        """On an idle room: an SSE comment (a WebSocket has its own pings), which fails if the peer is
        gone; a closed transport is noticed without writing."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the subscriber went away")
        if not isinstance(self.out, web.WebSocketResponse):
            await self.out.write(b": keep-alive\n\n")


def websocket_text_frame(payload: bytes) -> bytes:
    """A whole, final, unmasked WebSocket text frame (RFC 6455 section 5.2), as a server sends it."""
    size = len(payload)
    if size < 126:
        return struct.pack("!BB", 0x81, size) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


def frames_of(render: Callable[[StreamEvent], bytes]) -> Callable[[StreamEvent], bytes]:
    def frame(event: StreamEvent) -> bytes:
        return event.render("ws-frame", lambda e: websocket_text_frame(render(e)))

    return frame


def ws_event(event: StreamEvent, room: str) -> dict[str, Any]:
    """Synap's WebSocket frame: the room event with ``type`` "event" (and ``event_id``)."""
    return {**event.room_json(room), "type": "event", "event_id": event.body.id}


async def send_error(out: web.StreamResponse, message: str) -> None:
    with contextlib.suppress(ConnectionError):
        if isinstance(out, web.WebSocketResponse):
            await out.send_str(json.dumps({"type": "error", "error": message}))
        else:
            await out.write(b"event: error\ndata: %s\n\n" % json.dumps({"error": message}).encode())


async def drain_incoming(ws: web.WebSocketResponse, closed: asyncio.Event) -> None:
    """Read (and ignore) what the peer sends, so that a close is noticed."""
    try:
        async for msg in ws:
            if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break
    finally:
        closed.set()
