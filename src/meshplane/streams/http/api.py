"""The route handlers: thin adapters from HTTP, WebSocket and SSE to the streams service."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, generate_latest

from meshplane.core.streamlog import RetentionPolicy
from meshplane.streams.errors import (
    BadRequest,
    LimitReached,
    NotFound,
    StreamError,
)
from meshplane.streams.events import StreamEvent
from meshplane.streams.http.commands import Commands, failure_envelope, history
from meshplane.streams.http.groups import GroupApi
from meshplane.streams.http.metrics import REGISTRY, readable_metrics
from meshplane.streams.http.params import (
    GRANT,
    MAX_CONSUME_LIMIT,
    get_int,
    json_response,
    parse_json_object,
    query_int,
    read_json,
    readable,
    retention_secs_of,
    topic_list,
)
from meshplane.streams.http.push import RoomPusher, drain_incoming, frames_of, ws_event
from meshplane.streams.http.readers import ReaderApi
from meshplane.streams.http.vpn_queues import queue_topics
from meshplane.streams.readers import Readers
from meshplane.streams.rooms import Room
from meshplane.streams.service import StreamsService
from meshplane.version import __version__

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()


class Api:
    def __init__(self, engine: StreamsService) -> None:
        self.engine = engine
        self.commands = Commands(engine)
        self.groups = GroupApi(engine, self.commands)
        self.readers = ReaderApi(engine, Readers())

    # health and meta

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "healthy", "service": "meshplane-streams", "version": __version__})

    async def storage(self, request: web.Request) -> web.Response:
        e = self.engine
        return json_response(
            {
                "problems": e.storage_problems(),
                "fsync_errors": e.durability.fsync_errors,
                "limits": {name: {"used": used, "limit": most} for name, (used, most) in e.limits().items()},
                "limits_refused": dict(self.commands.refused),
            }
        )

    async def ready(self, request: web.Request) -> web.Response:
        ok = self.engine.ready
        return json_response({"status": "ready" if ok else "starting"}, 200 if ok else 503)

    async def command(self, request: web.Request) -> web.Response:
        try:
            envelope = await read_json(request)
        except StreamError as exc:
            return json_response(failure_envelope(None, exc))
        return json_response(await self.commands.answer(envelope, request.get(GRANT)))

    async def command_ws(self, request: web.Request) -> web.StreamResponse:
        """Commands over one WebSocket: an envelope per text frame, answered in order, no HTTP per call."""
        ws = web.WebSocketResponse(heartbeat=30)
        await ws.prepare(request)
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                try:
                    envelope = parse_json_object(message.data, "a command")
                    answer = await self.commands.answer(envelope, request.get(GRANT))
                except StreamError as exc:
                    answer = failure_envelope(None, exc)
                except Exception as exc:  # a bug must not close everyone's pipelined commands
                    log.exception("command failed")
                    answer = failure_envelope(None, StreamError(f"internal error: {type(exc).__name__}"))
                    answer["code"] = 500
            elif message.type == WSMsgType.BINARY:
                answer = failure_envelope(None, BadRequest("commands are JSON text frames, not binary"))
            else:
                break
            await ws.send_frame(_json.encode(answer), WSMsgType.TEXT)
        return ws

    # rooms

    async def room_list(self, request: web.Request) -> web.Response:
        rooms = readable(request, sorted(self.engine.rooms))
        return json_response({"rooms": rooms, "count": len(rooms)})

    async def room_create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        room, _ = await self.engine.create_room(
            request.match_info["room"], get_int(body, "max_events", None, minimum=1), retention_secs_of(body)
        )
        return json_response({"success": True, "room": room.name}, 201)

    async def room_retention(self, request: web.Request) -> web.Response:
        """``{"max_events": N, "retention_secs": S or null}``: what is left out stays as it is."""
        body = await read_json(request)
        if not body.keys() & {"max_events", "retention_secs"}:
            raise BadRequest("body must set max_events or retention_secs (null: no time limit)")
        room = self.engine.room(request.match_info["room"])
        max_events = get_int(body, "max_events", room.max_events)
        retention_secs = retention_secs_of(body) if "retention_secs" in body else room.retention_secs
        room = await self.engine.set_room_retention(room.name, max_events, retention_secs)
        return json_response({"success": True, "room": room.name, **room.settings()})

    async def room_get_or_create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        room, created = await self.engine.create_room(
            request.match_info["room"],
            get_int(body, "max_events", None, minimum=1),
            retention_secs_of(body),
            exist_ok=True,
        )
        return json_response({"success": True, "room": room.name, "created": created})

    async def room_delete(self, request: web.Request) -> web.Response:
        name = request.match_info["room"]
        if not await self.engine.delete_room(name):
            raise NotFound(f"room {name!r} not found")
        return json_response({"success": True, "deleted": True, "room": name})

    async def room_publish(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        body["room"] = request.match_info["room"]
        return json_response(await self.commands.cmd_stream_publish(body))

    async def room_consume(self, request: web.Request) -> web.Response:
        p: dict[str, Any] = dict(request.query)
        p.update(room=request.match_info["room"], subscriber_id=request.match_info["subscriber_id"])
        return json_response(await self.commands.cmd_stream_consume(p))

    async def room_history(self, request: web.Request) -> web.Response:
        return json_response(
            await history(
                self.engine,
                request.match_info["room"],
                query_int(request, "from_offset"),
                query_int(request, "to_offset"),
                query_int(request, "limit", 100, minimum=1, maximum=MAX_CONSUME_LIMIT),
            )
        )

    async def room_stats(self, request: web.Request) -> web.Response:
        return json_response(self.engine.room(request.match_info["room"]).stats())

    async def room_ws(self, request: web.Request) -> web.StreamResponse:
        name, subscriber = request.match_info["room"], request.match_info["subscriber_id"]
        from_offset = query_int(request, "from_offset")
        room = await self.engine.room_or_create(name)
        start = room.resolve(from_offset)
        room.touch_subscriber(subscriber, self.engine.config.max_subscribers_per_room)
        ws = web.WebSocketResponse(heartbeat=30)
        await ws.prepare(request)
        await ws.send_str(
            json.dumps({"type": "connected", "room": name, "subscriber_id": subscriber, "from_offset": start})
        )
        await self._push_room(
            request,
            ws,
            room,
            subscriber,
            start,
            lambda e: e.render("ws", lambda x: _json.encode(ws_event(x, name))),
        )
        return ws

    async def room_sse(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events for browsers; ``Last-Event-ID`` (an offset) resumes after it."""
        name = request.match_info["room"]
        last_id = request.headers.get("Last-Event-ID")
        if last_id is not None:
            from_offset: int | None = get_int({"Last-Event-ID": last_id}, "Last-Event-ID", minimum=-1) + 1
        else:
            from_offset = query_int(request, "from_offset")
        room = await self.engine.room_or_create(name)
        start = room.resolve(from_offset)
        if len(room.pushers) >= self.engine.config.max_subscribers_per_room:
            raise LimitReached(
                f"room {name!r} has {len(room.pushers)} live subscribers (the limit)", "room_pushers"
            )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        def build(e: StreamEvent) -> bytes:
            data = _json.encode(ws_event(e, name))
            return b"id: %d\nevent: %s\ndata: %s\n\n" % (e.offset, e.body.event_type.encode(), data)

        def frame(e: StreamEvent) -> bytes:
            return e.render("sse", build)

        await self._push_room(request, response, room, None, start, frame)
        return response

    async def _push_room(
        self,
        request: web.Request,
        out: web.StreamResponse,
        room: Room,
        subscriber: str | None,
        start: int,
        render: Callable[[StreamEvent], bytes],
    ) -> None:
        """Push the room's events from ``start`` as they arrive, in order, until the peer goes away."""
        # Unmasked and uncompressed, a frame is the same bytes for every subscriber: built once.
        plain_ws = isinstance(out, web.WebSocketResponse) and not out.compress
        pusher = RoomPusher(
            out, request.transport, room, start, render, frames_of(render) if plain_ws else None, self.engine
        )
        closed = asyncio.Event()
        reader = (
            asyncio.create_task(drain_incoming(out, closed))
            if isinstance(out, web.WebSocketResponse)
            else None
        )
        room.pushers.add(pusher)
        try:
            await pusher.run(closed, subscriber)
        except ConnectionError:
            pass
        finally:
            room.pushers.discard(pusher)
            if subscriber is not None:
                room.subscribers.pop(subscriber, None)
            if reader is not None:
                reader.cancel()
            if isinstance(out, web.WebSocketResponse):
                await out.close()

    # pub/sub

    async def pubsub_publish(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        body["topic"] = request.match_info["topic"]
        return json_response(await self.commands.cmd_pubsub_publish(body))

    async def pubsub_topics(self, request: web.Request) -> web.Response:
        return json_response(await self.commands.cmd_pubsub_topics({}))

    async def pubsub_ws(self, request: web.Request) -> web.StreamResponse:
        topics = topic_list(request.query.get("topics", ""))
        listener_id = request.query.get("subscriber_id") or uuid.uuid4().hex
        ws = web.WebSocketResponse(heartbeat=30)
        listener = self.engine.pubsub.listen(listener_id, topics)  # refused before the upgrade
        await ws.prepare(request)
        closed = asyncio.Event()
        reader = asyncio.create_task(drain_incoming(ws, closed))
        try:
            await ws.send_str(
                json.dumps({"type": "connected", "subscriber_id": listener_id, "topics": topics})
            )
            while not closed.is_set():
                get = asyncio.ensure_future(listener.next_frame())
                close_wait = asyncio.ensure_future(closed.wait())
                await asyncio.wait({get, close_wait}, return_when=asyncio.FIRST_COMPLETED)
                close_wait.cancel()
                if not get.done():
                    get.cancel()
                    break
                await ws.send_str(get.result().decode())
        except ConnectionError:
            pass
        finally:
            self.engine.pubsub.forget(listener_id)
            reader.cancel()
            await ws.close()
        return ws

    # topics

    async def topic_list(self, request: web.Request) -> web.Response:
        topics = readable(request, sorted({*self.engine.topics, *queue_topics(request)}))
        return json_response({"topics": topics, "count": len(topics)})

    async def topic_create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            retention = RetentionPolicy.from_json(body.get("retention_policy"))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        topic = await self.engine.create_topic(
            request.match_info["topic"],
            get_int(body, "num_partitions", None),
            get_int(body, "replication_factor", 1),
            retention,
            get_int(body, "segment_bytes", None),
        )
        s = topic.settings
        return json_response(
            {
                "success": True,
                "topic": topic.name,
                "num_partitions": s.num_partitions,
                "replication_factor": s.replication_factor,
                "retention_policy": s.retention.to_json(),
                "segment_bytes": s.segment_bytes,
            },
            201,
        )

    async def topic_retention(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if "retention_policy" not in body:
            raise BadRequest('body must be {"retention_policy": {"type": "Time", "retention_secs": 3600}}')
        try:
            retention = RetentionPolicy.from_json(body["retention_policy"])
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        topic = await self.engine.set_topic_retention(request.match_info["topic"], retention)
        return json_response(
            {"success": True, "topic": topic.name, "retention_policy": topic.settings.retention.to_json()}
        )

    async def topic_partitions(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        topic = await self.engine.add_partitions(
            request.match_info["topic"], get_int(body, "num_partitions", minimum=1)
        )
        return json_response({"success": True, "topic": topic.name, "num_partitions": len(topic.partitions)})

    async def topic_delete(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if not await self.engine.delete_topic(name):
            raise NotFound(f"topic {name!r} not found")
        self.readers.readers.forget_topic(name)  # a topic made again under the name starts unread
        return json_response({"success": True, "topic": name})

    async def topic_publish(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        body["topic"] = request.match_info["topic"]
        return json_response(await self.commands.cmd_topic_publish(body))

    async def topic_consume(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        partition = get_int(dict(request.match_info), "partition", minimum=0)
        body = await read_json(request)
        from_offset = get_int(body, "from_offset", 0, minimum=0)
        limit = get_int(body, "limit", 100, minimum=1, maximum=MAX_CONSUME_LIMIT)
        events = await self.engine.read_topic(name, partition, from_offset, limit)
        return json_response(
            {
                "topic": name,
                "partition_id": partition,
                "events": [e.topic_json(name) for e in events],
                "next_offset": events[-1].offset + 1 if events else from_offset,
                "count": len(events),
            }
        )

    def _records_request(self, request: web.Request) -> tuple[str, int, int, int]:
        """(topic, partition, from_offset, max_bytes) of a raw records request; the engine checks the
        offset as it reads (a shared backend's view may be behind what it holds)."""
        topic = self.engine.topic(request.match_info["topic"])
        partition = get_int(dict(request.match_info), "partition", minimum=0)
        topic.log_of(partition)  # a partition that does not exist: 404
        from_offset = query_int(request, "from_offset", 0, minimum=0)
        max_bytes = query_int(request, "max_bytes", 1 << 20, minimum=1, maximum=64 << 20)
        return topic.name, partition, from_offset, max_bytes

    def _bounds(self, topic: str, partition: int) -> dict[str, str]:
        plog = self.engine.topic(topic).partitions[partition]
        return {"X-Log-Start-Offset": str(plog.start_offset), "X-Log-End-Offset": str(plog.next_offset)}

    async def topic_records(self, request: web.Request) -> web.StreamResponse:
        """Raw records for bulk consumers (Spark): sent from the segment file by the kernel (sendfile)
        when the log is on this server's disk."""
        topic, partition, from_offset, max_bytes = self._records_request(request)
        if not self.engine.local_files:
            body = await self.engine.read_topic_raw(topic, partition, from_offset, max_bytes)
            self.engine.counters["bytes_read_in_bulk"] += len(body)
            headers = self._bounds(topic, partition)
            return web.Response(body=body, headers=headers, content_type="application/octet-stream")
        span = self.engine.local_span(topic, partition, from_offset, max_bytes)
        headers = self._bounds(topic, partition)
        if span is None:
            return web.Response(body=b"", headers=headers, content_type="application/octet-stream")
        segment, position, count = span
        self.engine.counters["bytes_read_in_bulk"] += count
        try:
            # Its own file object: sendfile moves the file position, which the log's descriptor must keep.
            file = segment.path.open("rb")
        except FileNotFoundError:  # retention removed the segment just now: answer as a new request would
            body = await self.engine.read_topic_raw(topic, partition, from_offset, max_bytes)
            return web.Response(body=body, headers=headers, content_type="application/octet-stream")
        with file:
            response = web.StreamResponse(headers=headers)
            response.content_type = "application/octet-stream"
            response.content_length = count
            await response.prepare(request)
            if request.transport is None:
                raise ConnectionResetError("the client went away")
            try:
                await asyncio.get_running_loop().sendfile(request.transport, file, position, count)
            except NotImplementedError:  # uvloop has no loop.sendfile: the bytes go through the response
                await response.write(await asyncio.to_thread(os.pread, file.fileno(), count, position))
            await response.write_eof()
        return response

    async def topic_records_location(self, request: web.Request) -> web.Response:
        """Where the records that ``topic_records`` would send lie in their segment file: readers on this
        host (Spark executors next to the server) read the file themselves, as HDFS's short-circuit
        reads do, and skip two copies through a socket. The file's device and inode let a reader check
        that the path it opens is this very file (not a namesake in another container or host)."""
        topic, partition, from_offset, max_bytes = self._records_request(request)
        local = self.engine.local_files
        span = self.engine.local_span(topic, partition, from_offset, max_bytes) if local else None
        plog = self.engine.topic(topic).log_of(partition)
        body: dict[str, Any] = {
            "log_start_offset": plog.start_offset,
            "log_end_offset": plog.next_offset,
            "local": local,  # false: the records are in no file here (JetStream): read them over HTTP
        }
        if span is not None:
            segment, position, length = span
            self.engine.counters["bytes_read_in_bulk"] += length  # the reader reads them itself
            stat = os.fstat(segment.fd)
            body.update(
                path=str(segment.path.absolute()),
                position=position,
                length=length,
                device=stat.st_dev,
                inode=stat.st_ino,
            )
        return json_response(body)

    async def topic_offsets_for_time(self, request: web.Request) -> web.Response:
        topic = self.engine.topic(request.match_info["topic"])
        timestamp_ms = get_int(dict(request.query), "timestamp_ms", minimum=0)
        offsets = await self.engine.offsets_for_time(topic.name, timestamp_ms)
        return json_response(
            {
                "topic": topic.name,
                "timestamp_ms": timestamp_ms,
                "offsets": {str(p): o for p, o in enumerate(offsets)},
            }
        )

    async def topic_stats(self, request: web.Request) -> web.Response:
        topic = self.engine.topic(request.match_info["topic"])
        s = topic.settings
        return json_response(
            {
                "topic": topic.name,
                "num_partitions": s.num_partitions,
                "retention_policy": s.retention.to_json(),
                "segment_bytes": s.segment_bytes,
                "partitions": [topic.partition_stats(p) for p in range(len(topic.partitions))],
            }
        )

    # metrics

    async def metrics(self, request: web.Request) -> web.Response:
        registry: CollectorRegistry = request.app[REGISTRY]
        body = generate_latest(registry)
        if request.get(GRANT) is not None:
            body = readable_metrics(request, body)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")
