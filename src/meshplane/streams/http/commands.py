"""The transport-neutral commands: Synap's ``stream.*`` / ``pubsub.*`` and meshplane's ``topic.*`` /
``group.*``, served by ``POST /api/v1/command`` and the command WebSocket, and run by the REST routes."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from meshplane.streams.errors import (
    BadRequest,
    Forbidden,
    LimitReached,
    NotFound,
    StreamError,
)
from meshplane.streams.grants import Grant, Level
from meshplane.streams.http.params import (
    MAX_CONSUME_LIMIT,
    error_body,
    event_type_of,
    get_int,
    get_metadata,
    get_str,
    positive,
    topic_event,
    topic_list,
)
from meshplane.streams.service import StreamsService

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


# A VPN's ``group.*`` command on a group of one of its mesh queues (those are the default VPN's
# service's, under stored names: vpn_queues.py): the commands to run it, its payload under the stored
# name, and the group's name as the VPN writes it; None for a command on the VPN's own.
QueueRoute = Callable[[dict[str, Any]], "tuple[Commands, dict[str, Any], str] | None"]


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
        self.refused: Counter[str] = Counter()  # answers a limit refused, by limit (its VPN's, as the engine)
        self.queue_route: QueueRoute | None = None  # a VPN's, on a mesh node: its queues' groups

    def note(self, exc: StreamError) -> None:
        """Count an answer that a limit refused (every route's and command's: metrics and GET /storage)."""
        if isinstance(exc, LimitReached):
            self.refused[exc.limit] += 1

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
            if command == "group.commit":
                check_reset(payload, grant)
        routed = self.queue_route(payload) if self.queue_route and command.startswith("group.") else None
        if routed is None:
            result: dict[str, Any] = await handler(payload)
            return result
        commands, stored, group = routed
        answer: dict[str, Any] = await getattr(commands, handler.__name__)(stored)
        return {**answer, "group_id": group} if "group_id" in answer else answer

    async def answer(self, envelope: dict[str, Any], grant: Grant | None = None) -> dict[str, Any]:
        """The answer envelope for a request envelope ``{command, request_id, payload}``."""
        request_id = envelope.get("request_id")
        try:
            command = get_str(envelope, "command")
            payload = envelope.get("payload") or {}
            if not isinstance(payload, dict):
                raise BadRequest("payload must be an object")
            result = await self.run(command, payload, grant)
        except StreamError as exc:
            self.note(exc)
            return failure_envelope(request_id, exc)
        return {"success": True, "request_id": request_id, "payload": result, "error": None}

    async def cmd_stream_create(self, p: dict[str, Any]) -> dict[str, Any]:
        room = get_str(p, "room")
        await self.engine.create_room(room, get_int(p, "max_events", None, minimum=1))
        return {"success": True, "room": room}

    async def cmd_stream_get_or_create(self, p: dict[str, Any]) -> dict[str, Any]:
        room = get_str(p, "room")
        _, created = await self.engine.create_room(
            room, get_int(p, "max_events", None, minimum=1), exist_ok=True
        )
        return {"success": True, "room": room, "created": created}

    async def cmd_stream_delete(self, p: dict[str, Any]) -> dict[str, Any]:
        room = get_str(p, "room")
        if not await self.engine.delete_room(room):
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
        self.engine.room(name).touch_subscriber(subscriber, self.engine.config.max_subscribers_per_room)
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
        return await history(
            self.engine,
            name,
            get_int(p, "from_offset", None),
            get_int(p, "to_offset", None),
            get_int(p, "limit", 100, minimum=1, maximum=MAX_CONSUME_LIMIT),
        )

    async def cmd_stream_stats(self, p: dict[str, Any]) -> dict[str, Any]:
        return self.engine.room(get_str(p, "room")).stats()

    async def cmd_stream_list(self, p: dict[str, Any]) -> dict[str, Any]:
        rooms = sorted(self.engine.rooms)
        return {"rooms": rooms, "count": len(rooms)}

    async def cmd_pubsub_publish(self, p: dict[str, Any]) -> dict[str, Any]:
        topic = get_str(p, "topic")
        if "payload" not in p and "data" not in p:
            raise BadRequest("missing field 'payload' (or 'data')")
        payload, metadata = p.get("payload", p.get("data")), get_metadata(p)
        if p.get("guaranteed") is True:
            return await self.engine.pubsub.publish_guaranteed(topic, payload, metadata)
        return self.engine.pubsub.publish(topic, payload, metadata)

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
            placed = [i for i, e in enumerate(batch) if "partition" in e]
            if placed:  # one batch lands in one partition: an event's own would be ignored
                raise BadRequest(
                    f"events[{placed[0]}] has a partition; a batch goes to one partition: set partition "
                    "beside events, or publish those events in their own batch"
                )
            items = batch
        else:
            items = [p]
        events = [topic_event(item) for item in items]
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
        generation, partitions = await self.engine.join_group(
            group_id, member, positive(p, "session_timeout_secs")
        )
        return {"member_id": member, "group_id": group_id, "generation": generation, "partitions": partitions}

    async def cmd_group_assignment(self, p: dict[str, Any]) -> dict[str, Any]:
        group_id, member = get_str(p, "group"), get_str(p, "member_id")
        generation, partitions = await self.engine.group_assignment(group_id, member)
        return {"member_id": member, "group_id": group_id, "partitions": partitions, "generation": generation}

    async def cmd_group_heartbeat(self, p: dict[str, Any]) -> dict[str, Any]:
        group_id, member = get_str(p, "group"), get_str(p, "member_id")
        generation, partitions = await self.engine.group_heartbeat(group_id, member)
        return {"success": True, "member_id": member, "generation": generation, "partitions": partitions}

    async def cmd_group_leave(self, p: dict[str, Any]) -> dict[str, Any]:
        member = get_str(p, "member_id")
        generation = await self.engine.leave_group(get_str(p, "group"), member)
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
        group = await self.engine.fresh_group(get_str(p, "group"))
        partition = get_int(p, "partition_id", minimum=0, maximum=group.partitions - 1)
        return {
            "group_id": group.group_id,
            "partition_id": partition,
            "offset": group.committed.get(partition),
        }


def check_reset(payload: dict[str, Any], grant: Grant | None) -> None:
    """A commit without a member moves the group's offset wherever it says (a reset, as the dashboard
    does): only an admin token may, while a member's own commit (fenced by its generation) needs read."""
    group = payload.get("group")
    if grant is not None and payload.get("member_id") is None and not grant.allows("admin", [group]):
        raise Forbidden(
            f"a commit without a member_id resets group {group!r}'s offsets: it needs an admin token"
        )


def failure_envelope(request_id: Any, exc: StreamError) -> dict[str, Any]:
    """Synap's failure answer, plus the status and type the REST routes would give (for typed errors)."""
    body = error_body(exc)
    body["error"] = f"Invalid request: {exc}"
    return {"success": False, "request_id": request_id, "payload": None, **body}


async def history(
    engine: StreamsService, name: str, from_offset: int | None, to_offset: int | None, limit: int
) -> dict[str, Any]:
    room = await engine.fresh_room(name)
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
