"""``meshplane serve``: the streams service over HTTP, WebSocket and server-sent events (aiohttp).

Synap-compatible: the command endpoint ``POST /api/v1/command`` that synap-sdk uses over http://,
the room REST routes and WebSockets, and the topic / consumer-group REST routes. Every route is
declared once in :data:`ROUTES`, which also produces the OpenAPI description.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from meshplane.core.groups import GroupError
from meshplane.core.streamlog import RetentionPolicy, StoredEvent
from meshplane.streams.access import Grant, Level, Tokens
from meshplane.streams.config import new_event_id
from meshplane.streams.errors import (
    BadRequest,
    Forbidden,
    LimitReached,
    NotFound,
    OffsetOutOfRange,
    PayloadTooLarge,
    RequestTimeout,
    StreamError,
)
from meshplane.streams.events import StreamEvent
from meshplane.streams.rooms import Room
from meshplane.streams.service import StreamsService
from meshplane.streams.topics import Topic

log = logging.getLogger(__name__)

ENGINE: web.AppKey[StreamsService] = web.AppKey("engine", StreamsService)
GRANT = "meshplane.grant"  # the request's grant, when the server requires tokens
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_CONSUME_LIMIT = 1000
INT64_MAX = 2**63 - 1
_json = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def error_body(exc: StreamError | GroupError) -> dict[str, Any]:
    kind = exc.kind if isinstance(exc, StreamError) else type(exc).__name__
    body: dict[str, Any] = {"error": str(exc), "code": exc.status, "type": kind}
    if isinstance(exc, StreamError):
        body.update(exc.details())
    return body


def error_response(exc: StreamError | GroupError) -> web.Response:
    return json_response(error_body(exc), exc.status)


# --- request parsing -------------------------------------------------------------------------------


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is ``{}``."""
    seconds = request.app[ENGINE].config.body_timeout_secs
    try:
        async with asyncio.timeout(seconds):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body too large: {exc.text}") from None
    except TimeoutError:
        if request.transport is not None:
            request.transport.close()  # what was sent of the body is unusable
        raise RequestTimeout(f"the request body did not arrive within {seconds:g} s") from None
    return parse_json_object(raw, "request body")


def parse_json_object(raw: bytes | str, what: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = _json_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(f"{what} is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"{what} must be a JSON object, not {type(body).__name__}")
    return body


_MISSING = object()


def get_int(
    source: dict[str, Any],
    name: str,
    default: Any = _MISSING,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> Any:
    value = source.get(name, default)
    if value is _MISSING:
        raise BadRequest(f"missing field {name!r}")
    if value is None and default is _MISSING:
        raise BadRequest(f"{name} must be an integer, not null")
    if value is None or value is default:
        return value
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise BadRequest(f"{name} must be an integer, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, not {value!r}")
    if minimum is not None and value < minimum:
        raise BadRequest(f"{name} must be >= {minimum}, not {value}")
    maximum = INT64_MAX if maximum is None else maximum
    if value > maximum:
        raise BadRequest(f"{name} must be <= {maximum}, not {value}")
    return value


def get_str(source: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    value = source.get(name, default)
    if value is _MISSING:
        raise BadRequest(f"missing field {name!r}")
    if value is not default and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string, not {value!r}")
    return value


def get_metadata(source: dict[str, Any]) -> dict[str, str] | None:
    metadata = source.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object of strings")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}


def event_type_of(source: dict[str, Any]) -> str:
    """Synap's SDK sends ``event``, the seed ``event_type``: accept both."""
    value = source.get("event_type", source.get("event"))
    if not isinstance(value, str) or not value:
        raise BadRequest("missing field 'event' (or 'event_type'): a non-empty string")
    return value


def query_int(request: web.Request, name: str, default: int | None = None, **bounds: int) -> Any:
    return get_int(dict(request.query), name, default, **bounds)


# --- the command endpoint (synap-sdk) --------------------------------------------------------------


class Commands:
    """Commands: payload in, payload (always an object) out.

    Synap's ``stream.*`` and ``pubsub.*``, and meshplane's ``topic.*`` and ``group.*`` (the REST routes
    of topics and groups run these same functions, so both answer alike). They are served by
    ``POST /api/v1/command`` and, one envelope per text frame, by the WebSocket ``/api/v1/ws``.
    """

    PREFIXES = ("stream.", "pubsub.", "topic.", "group.")

    def __init__(self, engine: StreamsService) -> None:
        self.engine = engine

    async def run(self, command: str, payload: dict[str, Any], grant: Grant | None = None) -> dict[str, Any]:
        handler = getattr(self, "cmd_" + command.replace(".", "_"), None)
        if handler is None or not command.startswith(self.PREFIXES) or command not in COMMAND_ACCESS:
            raise BadRequest(f"unknown command {command!r}")
        if grant is not None:
            level, field_name = COMMAND_ACCESS[command]
            named = payload.get(field_name) if field_name else None
            names = named if isinstance(named, list) else [named if isinstance(named, str) else None]
            if not grant.allows(level, names):
                raise Forbidden(f"this token may not {command} {named or ''}".rstrip())
        result: dict[str, Any] = await handler(payload)
        return result

    async def answer(self, envelope: dict[str, Any], grant: Grant | None = None) -> dict[str, Any]:
        """The answer envelope for a request envelope ``{command, request_id, payload}``."""
        request_id = envelope.get("request_id")
        try:
            command = get_str(envelope, "command")
            payload = envelope.get("payload") or {}
            if not isinstance(payload, dict):
                raise BadRequest("payload must be an object")
            result = await self.run(command, payload, grant)
        except (StreamError, GroupError) as exc:
            return failure_envelope(request_id, exc)
        return {"success": True, "request_id": request_id, "payload": result, "error": None}

    async def cmd_stream_create(self, p: dict[str, Any]) -> dict[str, Any]:
        room = get_str(p, "room")
        self.engine.create_room(room, get_int(p, "max_events", None, minimum=1))
        return {"success": True, "room": room}

    async def cmd_stream_get_or_create(self, p: dict[str, Any]) -> dict[str, Any]:
        room = get_str(p, "room")
        _, created = self.engine.create_room(room, get_int(p, "max_events", None, minimum=1), exist_ok=True)
        return {"success": True, "room": room, "created": created}

    async def cmd_stream_delete(self, p: dict[str, Any]) -> dict[str, Any]:
        room = get_str(p, "room")
        if not self.engine.delete_room(room):
            raise NotFound(f"room {room!r} not found")
        return {"success": True, "deleted": True, "room": room}

    async def cmd_stream_publish(self, p: dict[str, Any]) -> dict[str, Any]:
        if "data" not in p:
            raise BadRequest("missing field 'data'")
        room, event = await self.engine.publish_room(
            get_str(p, "room"), event_type_of(p), p["data"], get_metadata(p)
        )
        return {
            "offset": event.offset,
            "room": room.name,
            "event_id": event.body.id,
            "subscribers_notified": len(room.pushers),
        }

    async def cmd_stream_consume(self, p: dict[str, Any]) -> dict[str, Any]:
        name = get_str(p, "room")
        subscriber = get_str(p, "subscriber_id", "sdk-reader")
        from_offset = get_int(p, "from_offset", 0)
        limit = get_int(p, "limit", 100, minimum=1, maximum=MAX_CONSUME_LIMIT)
        self.engine.touch_subscriber(self.engine.room(name), subscriber)
        room, events = self.engine.read_room(name, from_offset, limit)
        next_offset = events[-1].offset + 1 if events else room.resolve(from_offset)
        return {
            "room": name,
            "subscriber_id": subscriber,
            "events": [e.room_json(name) for e in events],
            "next_offset": next_offset,
        }

    async def cmd_stream_history(self, p: dict[str, Any]) -> dict[str, Any]:
        name = get_str(p, "room")
        return history(
            self.engine,
            name,
            get_int(p, "from_offset", None),
            get_int(p, "to_offset", None),
            get_int(p, "limit", 100, minimum=1, maximum=MAX_CONSUME_LIMIT),
        )

    async def cmd_stream_stats(self, p: dict[str, Any]) -> dict[str, Any]:
        return self.engine.room_stats(get_str(p, "room"))

    async def cmd_stream_list(self, p: dict[str, Any]) -> dict[str, Any]:
        rooms = sorted(self.engine.rooms)
        return {"rooms": rooms, "count": len(rooms)}

    async def cmd_pubsub_publish(self, p: dict[str, Any]) -> dict[str, Any]:
        topic = get_str(p, "topic")
        if "payload" not in p and "data" not in p:
            raise BadRequest("missing field 'payload' (or 'data')")
        return self.engine.pubsub.publish(topic, p.get("payload", p.get("data")), get_metadata(p))

    async def cmd_pubsub_subscribe(self, p: dict[str, Any]) -> dict[str, Any]:
        topics = topic_list(p.get("topics"))
        subscriber = get_str(p, "subscriber_id", None) or uuid.uuid4().hex
        patterns = self.engine.pubsub.register(subscriber, topics)
        return {"subscriber_id": subscriber, "topics": sorted(patterns), "subscription_count": len(patterns)}

    async def cmd_pubsub_unsubscribe(self, p: dict[str, Any]) -> dict[str, Any]:
        subscriber = get_str(p, "subscriber_id")
        topics = topic_list(p.get("topics")) if p.get("topics") else None
        removed = self.engine.pubsub.unregister(subscriber, topics)
        return {"subscriber_id": subscriber, "unsubscribed": len(removed), "topics": removed}

    async def cmd_pubsub_topics(self, p: dict[str, Any]) -> dict[str, Any]:
        topics = sorted(self.engine.pubsub.topics)
        return {"topics": topics, "count": len(topics)}

    async def cmd_pubsub_stats(self, p: dict[str, Any]) -> dict[str, Any]:
        ps = self.engine.pubsub
        return {
            "topics": len(ps.topics),
            "subscribers": len(ps.registered),
            "live_listeners": len(ps.listeners),
            "published": ps.published,
            "delivered": ps.delivered,
            "dropped": ps.dropped,
        }

    async def cmd_topic_publish(self, p: dict[str, Any]) -> dict[str, Any]:
        """One event ({event_type, key?, data}) or a batch ({events: [...]}) with optional partition."""
        name = get_str(p, "topic")
        partition = get_int(p, "partition", None, minimum=0)
        batch = p.get("events")
        if batch is not None:
            if not isinstance(batch, list) or not batch or not all(isinstance(e, dict) for e in batch):
                raise BadRequest("events must be a non-empty list of objects")
            items = batch
        else:
            items = [p]
        events = [_topic_event(item) for item in items]
        places = await self.engine.publish_topic(name, events, partition, get_str(p, "idempotency_key", None))
        if batch is None:
            ((partition_id, offset),) = places
            return {"partition_id": partition_id, "offset": offset, "topic": name}
        return {
            "topic": name,
            "count": len(places),
            "results": [{"partition_id": pid, "offset": o} for pid, o in places],
        }

    async def cmd_group_join(self, p: dict[str, Any]) -> dict[str, Any]:
        group_id = get_str(p, "group")
        member = get_str(p, "member_id", None) or str(uuid.uuid4())
        generation, partitions = self.engine.group_store.join(
            group_id, member, _positive(p, "session_timeout_secs")
        )
        return {"member_id": member, "group_id": group_id, "generation": generation, "partitions": partitions}

    async def cmd_group_assignment(self, p: dict[str, Any]) -> dict[str, Any]:
        group_id, member = get_str(p, "group"), get_str(p, "member_id")
        partitions = self.engine.group_store.assignment(group_id, member)
        return {
            "member_id": member,
            "group_id": group_id,
            "partitions": partitions,
            "generation": self.engine.group(group_id).generation,
        }

    async def cmd_group_heartbeat(self, p: dict[str, Any]) -> dict[str, Any]:
        group_id, member = get_str(p, "group"), get_str(p, "member_id")
        generation = self.engine.group_store.heartbeat(group_id, member)
        return {
            "success": True,
            "member_id": member,
            "generation": generation,
            "partitions": self.engine.group(group_id).assignment.get(member, []),
        }

    async def cmd_group_leave(self, p: dict[str, Any]) -> dict[str, Any]:
        member = get_str(p, "member_id")
        generation = self.engine.group_store.leave(get_str(p, "group"), member)
        return {"success": True, "member_id": member, "generation": generation}

    async def cmd_group_commit(self, p: dict[str, Any]) -> dict[str, Any]:
        partition = get_int(p, "partition_id", minimum=0)
        offset = get_int(p, "offset", minimum=0)
        await self.engine.commit(
            get_str(p, "group"),
            partition,
            offset,
            get_str(p, "member_id", None),
            get_int(p, "generation", None),
        )
        return {"success": True, "partition_id": partition, "offset": offset}

    async def cmd_group_offset(self, p: dict[str, Any]) -> dict[str, Any]:
        group = self.engine.group(get_str(p, "group"))
        partition = get_int(p, "partition_id", minimum=0, maximum=group.partitions - 1)
        return {
            "group_id": group.group_id,
            "partition_id": partition,
            "offset": group.committed.get(partition),
        }


_GROUP_PATH_FIELDS = {"group": "group", "member": "member_id", "partition": "partition_id"}


def failure_envelope(request_id: Any, exc: StreamError | GroupError) -> dict[str, Any]:
    """Synap's failure answer, plus the status and type the REST routes would give (for typed errors)."""
    body = error_body(exc)
    body["error"] = f"Invalid request: {exc}"
    return {"success": False, "request_id": request_id, "payload": None, **body}


def topic_list(raw: object) -> list[str]:
    if isinstance(raw, str):
        raw = [t for t in raw.split(",") if t]
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) and t for t in raw):
        raise BadRequest("topics must be a non-empty list of topic patterns")
    return list(raw)


def history(
    engine: StreamsService, name: str, from_offset: int | None, to_offset: int | None, limit: int
) -> dict[str, Any]:
    room = engine.room(name)
    start = room.oldest if from_offset is None else from_offset
    _, events = engine.read_room(name, start, limit, to_offset)
    nxt = room.next_offset
    return {
        "room": name,
        "events": [e.room_json(name) for e in events],
        "oldest_offset": room.oldest,
        "newest_offset": nxt - 1 if nxt > room.oldest else None,
        "next_offset": nxt,
    }


# --- routes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    body: dict[str, str] = field(default_factory=dict)  # field -> JSON type, for the OpenAPI description
    public: bool = False

    @property
    def access(self) -> Level | None:
        """What a token needs for this route (None: each command says, on the command routes)."""
        if self.tag == "command":
            return None
        if self.method == "GET" or self.path.endswith(_READ_ACTIONS):
            return "read"
        return "write" if self.path.endswith("/publish") else "admin"

    @property
    def browser(self) -> bool:
        """A route browsers open with WebSocket or EventSource, which cannot set headers: the only
        routes that take the token from ``?access_token=``."""
        pushed = self.path.endswith(("/ws", "/ws/{subscriber_id}")) or self.path.startswith("/events/")
        return self.method == "GET" and pushed


# Consumer-side actions that change state: what a consumer with a read token does.
_READ_ACTIONS = ("/consume", "/join", "/heartbeat", "/leave", "/offsets/commit")

# Each command: the access it needs and the payload field naming what it touches.
COMMAND_ACCESS: dict[str, tuple[Level, str | None]] = {
    "stream.create": ("write", "room"),
    "stream.get_or_create": ("write", "room"),
    "stream.delete": ("admin", "room"),
    "stream.publish": ("write", "room"),
    "stream.consume": ("read", "room"),
    "stream.history": ("read", "room"),
    "stream.stats": ("read", "room"),
    "stream.list": ("read", None),
    "pubsub.publish": ("write", "topic"),
    "pubsub.subscribe": ("read", "topics"),
    "pubsub.unsubscribe": ("read", None),
    "pubsub.topics": ("read", None),
    "pubsub.stats": ("read", None),
    "topic.publish": ("write", "topic"),
    "group.join": ("read", "group"),
    "group.assignment": ("read", "group"),
    "group.heartbeat": ("read", "group"),
    "group.leave": ("read", "group"),
    "group.commit": ("read", "group"),
    "group.offset": ("read", "group"),
}


class Api:
    def __init__(self, engine: StreamsService) -> None:
        self.engine = engine
        self.commands = Commands(engine)

    # health and meta

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "healthy", "service": "meshplane-streams", "version": _version()})

    async def storage(self, request: web.Request) -> web.Response:
        e = self.engine
        return json_response(
            {
                "problems": e.storage_problems(),
                "fsync_errors": e.durability.fsync_errors,
                "limits": {name: {"used": used, "limit": most} for name, (used, most) in e.limits().items()},
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
        return json_response(await self.commands.cmd_stream_list({}))

    async def room_create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        room, _ = self.engine.create_room(
            request.match_info["room"], get_int(body, "max_events", None, minimum=1), _retention_secs(body)
        )
        return json_response({"success": True, "room": room.name}, 201)

    async def room_get_or_create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        room, created = self.engine.create_room(
            request.match_info["room"],
            get_int(body, "max_events", None, minimum=1),
            _retention_secs(body),
            exist_ok=True,
        )
        return json_response({"success": True, "room": room.name, "created": created})

    async def room_delete(self, request: web.Request) -> web.Response:
        name = request.match_info["room"]
        if not self.engine.delete_room(name):
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
            history(
                self.engine,
                request.match_info["room"],
                query_int(request, "from_offset"),
                query_int(request, "to_offset"),
                query_int(request, "limit", 100, minimum=1, maximum=MAX_CONSUME_LIMIT),
            )
        )

    async def room_stats(self, request: web.Request) -> web.Response:
        return json_response(self.engine.room_stats(request.match_info["room"]))

    async def room_ws(self, request: web.Request) -> web.StreamResponse:
        name, subscriber = request.match_info["room"], request.match_info["subscriber_id"]
        from_offset = query_int(request, "from_offset")
        room = self.engine.room(name, create=True)
        start = room.resolve(from_offset)
        self.engine.touch_subscriber(room, subscriber)
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
            lambda e: e.render("ws", lambda x: _json.encode(_ws_event(x, name))),
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
        room = self.engine.room(name, create=True)
        start = room.resolve(from_offset)
        if len(room.pushers) >= self.engine.config.max_subscribers_per_room:
            raise LimitReached(f"room {name!r} has {len(room.pushers)} live subscribers (the limit)")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        def build(e: StreamEvent) -> bytes:
            data = _json.encode(_ws_event(e, name))
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
            out, request.transport, room, start, render, _frames_of(render) if plain_ws else None, self.engine
        )
        closed = asyncio.Event()
        reader = (
            asyncio.create_task(_drain_incoming(out, closed))
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
        reader = asyncio.create_task(_drain_incoming(ws, closed))
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
        topics = sorted(self.engine.topics)
        return json_response({"topics": topics, "count": len(topics)})

    async def topic_create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            retention = RetentionPolicy.from_json(body.get("retention_policy"))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        topic = self.engine.create_topic(
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

    async def topic_partitions(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        topic = self.engine.add_partitions(
            request.match_info["topic"], get_int(body, "num_partitions", minimum=1)
        )
        return json_response({"success": True, "topic": topic.name, "num_partitions": len(topic.partitions)})

    async def topic_delete(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if not self.engine.delete_topic(name):
            raise NotFound(f"topic {name!r} not found")
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
        topic = self.engine.topic(name)
        events = topic.read(partition, from_offset, limit)
        self.engine.counters["events_consumed"] += len(events)
        return json_response(
            {
                "topic": name,
                "partition_id": partition,
                "events": [e.topic_json(name) for e in events],
                "next_offset": events[-1].offset + 1 if events else from_offset,
                "count": len(events),
            }
        )

    def _records_request(self, request: web.Request) -> tuple[Topic, int, int, int]:
        """(topic, partition, from_offset, max_bytes) of a raw records request."""
        topic = self.engine.topic(request.match_info["topic"])
        partition = get_int(dict(request.match_info), "partition", minimum=0)
        from_offset = query_int(request, "from_offset", 0, minimum=0)
        max_bytes = query_int(request, "max_bytes", 1 << 20, minimum=1, maximum=64 << 20)
        return topic, partition, from_offset, max_bytes

    async def topic_records(self, request: web.Request) -> web.StreamResponse:
        """Raw records for bulk consumers (Spark): sent from the segment file by the kernel (sendfile)."""
        topic, partition, from_offset, max_bytes = self._records_request(request)
        span = topic.raw_span(partition, from_offset, max_bytes)
        plog = topic.partitions[partition]
        headers = {"X-Log-Start-Offset": str(plog.start_offset), "X-Log-End-Offset": str(plog.next_offset)}
        if span is None:
            return web.Response(body=b"", headers=headers, content_type="application/octet-stream")
        segment, position, count = span
        try:
            # Its own file object: sendfile moves the file position, which the log's descriptor must keep.
            file = segment.path.open("rb")
        except FileNotFoundError:  # retention removed the segment just now: answer as a new request would
            body = topic.read_raw(partition, from_offset, max_bytes)
            return web.Response(body=body, headers=headers, content_type="application/octet-stream")
        with file:
            response = web.StreamResponse(headers=headers)
            response.content_type = "application/octet-stream"
            response.content_length = count
            await response.prepare(request)
            if request.transport is None:
                raise ConnectionResetError("the client went away")
            await asyncio.get_running_loop().sendfile(request.transport, file, position, count)
            await response.write_eof()
        return response

    async def topic_records_location(self, request: web.Request) -> web.Response:
        """Where the records that ``topic_records`` would send lie in their segment file: readers on this
        host (Spark executors next to the server) read the file themselves, as HDFS's short-circuit
        reads do, and skip two copies through a socket. The file's device and inode let a reader check
        that the path it opens is this very file (not a namesake in another container or host)."""
        topic, partition, from_offset, max_bytes = self._records_request(request)
        span = topic.raw_span(partition, from_offset, max_bytes)
        plog = topic.partitions[partition]
        body: dict[str, Any] = {"log_start_offset": plog.start_offset, "log_end_offset": plog.next_offset}
        if span is not None:
            segment, position, length = span
            stat = os.fstat(segment.fd)
            body.update(
                path=str(segment.path.absolute()),
                position=position,
                length=length,
                device=stat.st_dev,
                inode=stat.st_ino,
            )
        return json_response(body)

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

    # consumer groups

    async def group_list(self, request: web.Request) -> web.Response:
        groups = sorted(self.engine.groups)
        return json_response({"groups": groups, "count": len(groups)})

    async def group_create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        group = self.engine.create_group(
            request.match_info["group"],
            get_str(body, "topic"),
            get_int(body, "partition_count", None, minimum=1),
            get_str(body, "strategy", "round_robin"),
            _positive(body, "session_timeout_secs"),
        )
        return json_response(
            {
                "success": True,
                "group_id": group.group_id,
                "topic": group.topic,
                "strategy": group.strategy,
                "partition_count": group.partitions,
            },
            201,
        )

    async def group_delete(self, request: web.Request) -> web.Response:
        name = request.match_info["group"]
        if not self.engine.delete_group(name):
            raise NotFound(f"consumer group {name!r} not found")
        return json_response({"success": True, "group_id": name})

    async def _group_command(
        self, request: web.Request, run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    ) -> web.Response:
        """A group route: the body (if any) and the path's names, handed to the group command."""
        body = await read_json(request) if request.can_read_body else {}
        for name, value in request.match_info.items():
            body[_GROUP_PATH_FIELDS[name]] = value
        return json_response(await run(body))

    async def group_join(self, request: web.Request) -> web.Response:
        return await self._group_command(request, self.commands.cmd_group_join)

    async def group_assignment(self, request: web.Request) -> web.Response:
        return await self._group_command(request, self.commands.cmd_group_assignment)

    async def group_heartbeat(self, request: web.Request) -> web.Response:
        return await self._group_command(request, self.commands.cmd_group_heartbeat)

    async def group_leave(self, request: web.Request) -> web.Response:
        return await self._group_command(request, self.commands.cmd_group_leave)

    async def group_commit(self, request: web.Request) -> web.Response:
        return await self._group_command(request, self.commands.cmd_group_commit)

    async def group_offset(self, request: web.Request) -> web.Response:
        return await self._group_command(request, self.commands.cmd_group_offset)

    async def group_stats(self, request: web.Request) -> web.Response:
        return json_response(self.engine.group_stats(request.match_info["group"]))

    # metrics and OpenAPI

    async def metrics(self, request: web.Request) -> web.Response:
        registry: CollectorRegistry = request.app[REGISTRY]
        return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document(self.routes()))

    def routes(self) -> list[Route]:
        g = "/consumer-groups/{group}"
        return [
            Route(
                "GET",
                "/health",
                self.health,
                "Liveness: always 200 while the process serves",
                "meta",
                public=True,
            ),
            Route(
                "GET",
                "/ready",
                self.ready,
                "Readiness: 200 once the data directory is loaded",
                "meta",
                public=True,
            ),
            Route("GET", "/metrics", self.metrics, "Prometheus metrics", "meta"),
            Route(
                "GET",
                "/storage",
                self.storage,
                "What recovery and verification found and set aside; descriptors; limits",
                "meta",
            ),
            Route("GET", "/openapi.json", self.openapi, "This description", "meta", public=True),
            Route(
                "POST",
                "/api/v1/command",
                self.command,
                "Synap command endpoint (stream.*, pubsub.*; also topic.*, group.*)",
                "command",
                {"command": "string", "request_id": "string", "payload": "object"},
            ),
            Route(
                "GET",
                "/api/v1/ws",
                self.command_ws,
                "WebSocket: the command endpoint's envelopes, one per text frame, answered in order",
                "command",
            ),
            Route("GET", "/stream/list", self.room_list, "List rooms", "rooms"),
            Route(
                "POST",
                "/stream/{room}",
                self.room_create,
                "Create a room (409 if it exists)",
                "rooms",
                {"max_events": "integer", "retention_secs": "number"},
            ),
            Route(
                "PUT",
                "/stream/{room}",
                self.room_get_or_create,
                "Get or create a room",
                "rooms",
                {"max_events": "integer", "retention_secs": "number"},
            ),
            Route("DELETE", "/stream/{room}", self.room_delete, "Delete a room and its history", "rooms"),
            Route(
                "POST",
                "/stream/{room}/publish",
                self.room_publish,
                "Publish an event; returns its offset",
                "rooms",
                {"event": "string", "event_type": "string", "data": "any", "metadata": "object"},
            ),
            Route(
                "GET",
                "/stream/{room}/consume/{subscriber_id}",
                self.room_consume,
                "Read events from ?from_offset= (negative: the last N), ?limit=",
                "rooms",
            ),
            Route(
                "GET",
                "/stream/{room}/history",
                self.room_history,
                "History between ?from_offset= and ?to_offset=, ?limit=",
                "rooms",
            ),
            Route("GET", "/stream/{room}/stats", self.room_stats, "Room statistics", "rooms"),
            Route(
                "GET",
                "/stream/{room}/ws/{subscriber_id}",
                self.room_ws,
                "WebSocket: replay from ?from_offset= then push events as they are published",
                "rooms",
            ),
            Route(
                "GET",
                "/events/{room}",
                self.room_sse,
                "Server-sent events of a room (Last-Event-ID resumes)",
                "rooms",
            ),
            Route(
                "POST",
                "/pubsub/{topic}/publish",
                self.pubsub_publish,
                "Publish a pub/sub message",
                "pubsub",
                {"payload": "any", "metadata": "object"},
            ),
            Route("GET", "/pubsub/topics", self.pubsub_topics, "Topics published so far", "pubsub"),
            Route(
                "GET",
                "/pubsub/ws",
                self.pubsub_ws,
                "WebSocket: messages of ?topics=a,b (wildcards * and #)",
                "pubsub",
            ),
            Route("GET", "/topics", self.topic_list, "List partitioned topics", "topics"),
            Route(
                "POST",
                "/topics/{topic}",
                self.topic_create,
                "Create a partitioned topic",
                "topics",
                {
                    "num_partitions": "integer",
                    "replication_factor": "integer",
                    "retention_policy": "object",
                    "segment_bytes": "integer",
                },
            ),
            Route("DELETE", "/topics/{topic}", self.topic_delete, "Delete a topic and its data", "topics"),
            Route(
                "POST",
                "/topics/{topic}/partitions",
                self.topic_partitions,
                "Grow a topic to num_partitions (never shrinks)",
                "topics",
                {"num_partitions": "integer"},
            ),
            Route(
                "POST",
                "/topics/{topic}/publish",
                self.topic_publish,
                "Publish one event (key routes by crc32(key) % partitions) or a batch ({events: [...]})",
                "topics",
                {
                    "event_type": "string",
                    "key": "string",
                    "data": "any",
                    "metadata": "object",
                    "partition": "integer",
                    "events": "array",
                    "idempotency_key": "string",
                },
            ),
            Route(
                "POST",
                "/topics/{topic}/partitions/{partition}/consume",
                self.topic_consume,
                "Read a partition from an offset",
                "topics",
                {"from_offset": "integer", "limit": "integer"},
            ),
            Route(
                "GET",
                "/topics/{topic}/partitions/{partition}/records",
                self.topic_records,
                "Raw records from ?from_offset= (up to ?max_bytes=) for bulk consumers; "
                "X-Log-Start-Offset / X-Log-End-Offset headers",
                "topics",
            ),
            Route(
                "GET",
                "/topics/{topic}/partitions/{partition}/records/location",
                self.topic_records_location,
                "Where .../records would read from (segment file path, position, length, device, "
                "inode; log start and end offsets): for readers on the server's host",
                "topics",
            ),
            Route("GET", "/topics/{topic}/stats", self.topic_stats, "Per-partition statistics", "topics"),
            Route("GET", "/consumer-groups", self.group_list, "List consumer groups", "groups"),
            Route(
                "POST",
                g,
                self.group_create,
                "Create a consumer group",
                "groups",
                {
                    "topic": "string",
                    "partition_count": "integer",
                    "strategy": "string",
                    "session_timeout_secs": "number",
                },
            ),
            Route("DELETE", g, self.group_delete, "Delete a consumer group and its offsets", "groups"),
            Route(
                "POST",
                g + "/join",
                self.group_join,
                "Join: returns member_id, generation and partitions",
                "groups",
                {"member_id": "string", "session_timeout_secs": "number"},
            ),
            Route(
                "GET",
                g + "/members/{member}/assignment",
                self.group_assignment,
                "A member's partitions in the current generation",
                "groups",
            ),
            Route(
                "POST",
                g + "/members/{member}/heartbeat",
                self.group_heartbeat,
                "Keep a member alive; returns the generation (changed: fetch the assignment)",
                "groups",
            ),
            Route(
                "DELETE",
                g + "/members/{member}/leave",
                self.group_leave,
                "Leave the group (rebalances)",
                "groups",
            ),
            Route(
                "POST",
                g + "/offsets/commit",
                self.group_commit,
                "Commit the next offset to read (fenced by member_id and generation)",
                "groups",
                {
                    "partition_id": "integer",
                    "offset": "integer",
                    "member_id": "string",
                    "generation": "integer",
                },
            ),
            Route(
                "GET",
                g + "/offsets/{partition}",
                self.group_offset,
                "A partition's committed offset",
                "groups",
            ),
            Route("GET", g + "/stats", self.group_stats, "Group state, members, generation, lag", "groups"),
        ]


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
        self.out, self.transport, self.room, self.cursor = out, transport, room, cursor
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
            or not isinstance(transport, asyncio.WriteTransport)
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
                await _send_error(self.out, f"room {room.name!r} was deleted")
                return
            async with self.lock:
                if self.cursor < room.oldest:
                    await _send_error(
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


def _positive(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise BadRequest(f"{name} must be a positive number, not {value!r}")
    return float(value)


def _retention_secs(body: dict[str, Any]) -> float | None:
    return _positive(body, "retention_secs")


def _topic_event(item: dict[str, Any]) -> StoredEvent:
    if "data" not in item:
        raise BadRequest("missing field 'data'")
    key = item.get("key")
    if key is not None and not isinstance(key, str):
        raise BadRequest(f"key must be a string, not {key!r}")
    return StoredEvent(new_event_id(), event_type_of(item), item["data"], key, get_metadata(item))


def websocket_text_frame(payload: bytes) -> bytes:
    """A whole, final, unmasked WebSocket text frame (RFC 6455 section 5.2), as a server sends it."""
    size = len(payload)
    if size < 126:
        return struct.pack("!BB", 0x81, size) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


def _frames_of(render: Callable[[StreamEvent], bytes]) -> Callable[[StreamEvent], bytes]:
    def frame(event: StreamEvent) -> bytes:
        return event.render("ws-frame", lambda e: websocket_text_frame(render(e)))

    return frame


def _ws_event(event: StreamEvent, room: str) -> dict[str, Any]:
    """Synap's WebSocket frame: the room event with ``type`` "event" (and ``event_id``)."""
    return {**event.room_json(room), "type": "event", "event_id": event.body.id}


async def _send_error(out: web.StreamResponse, message: str) -> None:
    with contextlib.suppress(ConnectionError):
        if isinstance(out, web.WebSocketResponse):
            await out.send_str(json.dumps({"type": "error", "error": message}))
        else:
            await out.write(b"event: error\ndata: %s\n\n" % json.dumps({"error": message}).encode())


async def _drain_incoming(ws: web.WebSocketResponse, closed: asyncio.Event) -> None:
    """Read (and ignore) what the peer sends, so that a close is noticed."""
    try:
        async for msg in ws:
            if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break
    finally:
        closed.set()


def _version() -> str:
    from meshplane import __version__

    return __version__


def openapi_document(routes: list[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "tags": [route.tag],
            "operationId": route.handler.__name__,
            "responses": {
                "200": {"description": "OK"},
                "400": {"description": "bad input"},
                "404": {"description": "unknown room, topic or group"},
            },
        }
        params = [part[1:-1] for part in route.path.split("/") if part.startswith("{")]
        if params:
            operation["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
            ]
        if route.body:
            operation["requestBody"] = {
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                k: ({} if v == "any" else {"type": v}) for k, v in route.body.items()
                            },
                        }
                    }
                }
            }
        if not route.public:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "meshplane streams", "version": _version()},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


# --- metrics ---------------------------------------------------------------------------------------

REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)


class EngineCollector(Collector):
    """Reads the engine's counters at scrape time."""

    def __init__(self, engine: StreamsService) -> None:
        self.engine = engine

    def collect(self) -> Any:
        e = self.engine
        for name, help_text in (
            ("events_published", "Events appended (rooms and topics)"),
            ("bytes_published", "Encoded bytes appended"),
            ("events_consumed", "Events read by consumers"),
            ("commits", "Offset commits accepted"),
            ("commits_rejected", "Offset commits rejected (stale generation, not owner)"),
            ("rebalances", "Consumer group rebalances"),
            ("duplicates_skipped", "Events of repeated idempotent publishes, not appended again"),
        ):
            yield CounterMetricFamily(f"meshplane_streams_{name}", help_text, value=e.counters[name])
        published = CounterMetricFamily(
            "meshplane_topic_events_published", "Events appended per partition", labels=["topic", "partition"]
        )
        end = GaugeMetricFamily(
            "meshplane_topic_next_offset", "Next offset per partition", labels=["topic", "partition"]
        )
        for topic in e.topics.values():
            for p, plog in enumerate(topic.partitions):
                published.add_metric([topic.name, str(p)], topic.published[p])
                end.add_metric([topic.name, str(p)], plog.next_offset)
        yield published
        yield end
        lag = GaugeMetricFamily(
            "meshplane_group_lag",
            "Events not yet committed by a consumer group",
            labels=["group", "partition"],
        )
        for group, p, value in e.lag():
            lag.add_metric([group, str(p)], value)
        yield lag
        yield GaugeMetricFamily("meshplane_rooms", "Rooms", value=len(e.rooms))
        yield GaugeMetricFamily(
            "meshplane_room_live_subscribers",
            "Pushed room subscribers (WebSocket, SSE)",
            value=sum(len(r.pushers) for r in e.rooms.values()),
        )
        yield CounterMetricFamily(
            "meshplane_pubsub_dropped", "Pub/sub messages dropped for slow listeners", value=e.pubsub.dropped
        )
        yield CounterMetricFamily(
            "meshplane_pubsub_registrations_expired",
            "Pub/sub registrations dropped for not being renewed",
            value=e.pubsub.expired,
        )
        yield GaugeMetricFamily(
            "meshplane_storage_problems",
            "Corrupt records, tails and metadata found and set aside (GET /storage lists them)",
            value=len(e.storage_problems()),
        )
        yield CounterMetricFamily("meshplane_fsync_errors", "Failed fsyncs", value=e.durability.fsync_errors)
        yield GaugeMetricFamily("meshplane_open_segment_files", "Segment files open", value=len(e.files))
        used = GaugeMetricFamily("meshplane_limit_used", "Use of each configured limit", labels=["limit"])
        limit = GaugeMetricFamily("meshplane_limit", "Configured limits", labels=["limit"])
        for name, (value, most) in e.limits().items():
            used.add_metric([name], value)
            limit.add_metric([name], most)
        yield used
        yield limit


# --- the application -------------------------------------------------------------------------------


def create_app(
    engine: StreamsService, *, tokens: Tokens | None = None, max_request_bytes: int | None = None
) -> web.Application:
    limit = max_request_bytes or max(engine.config.max_payload_bytes * 2, 1 << 20)
    api = Api(engine)
    routes = api.routes()
    by_key = {(r.method, r.path): r for r in routes}

    @web.middleware
    async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = by_key.get((request.method, resource.canonical if resource is not None else request.path))
        if tokens is not None and route is not None and not route.public:
            grant = _grant(request, tokens, query=route.browser)
            if grant is None:
                return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})
            names = [request.match_info[k] for k in ("room", "topic", "group") if k in request.match_info]
            if route.access is not None and not grant.allows(route.access, names or [None]):
                return error_response(Forbidden(f"this token may not {route.access} {', '.join(names)}"))
            request[GRANT] = grant
        try:
            return await handler(request)
        except (StreamError, GroupError) as exc:
            return error_response(exc)
        except web.HTTPRequestEntityTooLarge as exc:
            return error_response(PayloadTooLarge(f"request body too large: {exc.text}"))
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.empty_body is False:
                return json_response(
                    {"error": exc.reason, "code": exc.status, "type": "HttpError"}, exc.status
                )
            raise

    app = web.Application(middlewares=[errors_and_auth], client_max_size=limit)
    app[ENGINE] = engine
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    fsync_hist = Histogram(
        "meshplane_fsync_seconds",
        "fsync latency (group commit)",
        registry=registry,
        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    )
    engine.durability.on_fsync = fsync_hist.observe
    app[REGISTRY] = registry
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
    return app


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS context for ``serve`` from PEM files (the key never in the certificate's file)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def _grant(request: web.Request, tokens: Tokens, *, query: bool) -> Grant | None:
    """The grant of the token the request presents: a bearer token, Basic auth's password, or (on
    the WebSocket and SSE routes only, as browsers cannot set headers there) ``?access_token=``."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return tokens.grant_for(value.strip())
    if scheme.lower() == "basic":
        try:
            _, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return tokens.grant_for(password)
    presented = request.query.get("access_token") if query else None
    return tokens.grant_for(presented) if presented is not None else None


async def serve(
    engine: StreamsService,
    host: str,
    port: int,
    *,
    tokens: Tokens | None = None,
    tls: ssl.SSLContext | None = None,
    on_ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until ``stop`` is set (or forever)."""
    await engine.start()
    app = create_app(engine, tokens=tokens)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
        # Also closes a connection that sends no whole request (slowloris) in this time.
        keepalive_timeout=engine.config.idle_timeout_secs,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=tls)
        await site.start()
        bound = int(runner.addresses[0][1])
        if on_ready is not None:
            on_ready(bound)
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()
        await engine.close()
