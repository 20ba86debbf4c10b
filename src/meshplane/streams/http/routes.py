"""Every route, declared once as data: method, path, handler, summary, tag, body, the access it needs.
The OpenAPI description is made from the same table."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from aiohttp import web

from meshplane.dashboard import http as dashboard
from meshplane.streams.grants import Level
from meshplane.streams.http import staging
from meshplane.streams.http.api import Api
from meshplane.streams.http.mesh import (
    mesh_status,
    node_forget,
    queue_delete,
    queue_pause,
    queue_put,
    queue_resume,
    queues_list,
    vpns_reload,
)
from meshplane.streams.http.openapi import openapi_document
from meshplane.streams.http.params import Handler, json_response

log = logging.getLogger(__name__)


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
        return "write" if self.path.endswith(_WRITE_ACTIONS) else "admin"

    @property
    def browser(self) -> bool:
        """A route browsers open with WebSocket or EventSource, which cannot set headers: the only
        routes that take the token from ``?access_token=``."""
        pushed = self.path.endswith(("/ws", "/ws/{subscriber_id}")) or self.path.startswith("/events/")
        return self.method == "GET" and pushed


# Consumer-side actions that change state: what a consumer with a read token does.
_WRITE_ACTIONS = ("/publish", "/staged", "/staged/commit", "/staged/abort")
_READ_ACTIONS = ("/consume", "/join", "/heartbeat", "/leave", "/offsets/commit", "/readers/{reader}")


def route_table(api: Api) -> list[Route]:
    g = "/consumer-groups/{group}"

    async def openapi(request: web.Request) -> web.Response:
        return json_response(openapi_document(table))

    table = [
        Route(
            "GET",
            "/health",
            api.health,
            "Liveness: always 200 while the process serves",
            "meta",
            public=True,
        ),
        Route(
            "GET",
            "/ready",
            api.ready,
            "Readiness: 200 once the data directory is loaded",
            "meta",
            public=True,
        ),
        Route("GET", "/metrics", api.metrics, "Prometheus metrics", "meta"),
        # The node's, with every VPN's clients, users, queues and patterns: "mesh", refused to a VPN's token.
        Route("GET", "/mesh", mesh_status, "This mesh node: its links, interest and counters", "mesh"),
        Route(
            "GET", "/mesh/queues", queues_list, "This mesh node's queues (guaranteed subscriptions)", "mesh"
        ),
        Route(
            "PUT",
            "/mesh/queues/{name}",
            queue_put,
            "Make a queue: guaranteed events matching its patterns, stored in the topic of its name",
            "mesh",
            body={"patterns": "array"},
        ),
        Route(
            "DELETE", "/mesh/queues/{name}", queue_delete, "Stop a queue's interest (its topic stays)", "mesh"
        ),
        Route(
            "POST",
            "/mesh/queues/{name}/pause",
            queue_pause,
            "Pause a queue: it keeps storing, its topic's readers get nothing until it is resumed",
            "mesh",
        ),
        Route("POST", "/mesh/queues/{name}/resume", queue_resume, "Resume a paused queue", "mesh"),
        Route(
            "POST",
            "/mesh/vpns/reload",
            vpns_reload,
            "Read the Message VPN file again: users, permissions and limits, without a restart",
            "mesh",
        ),
        Route(
            "DELETE",
            "/mesh/nodes/{node}",
            node_forget,
            "Forget a departed node: its interest, spool and remembered queues",
            "mesh",
        ),
        Route(
            "GET",
            "/storage",
            api.storage,
            "What recovery and verification found and set aside; descriptors; limits",
            "meta",
        ),
        Route("GET", "/openapi.json", openapi, "This description", "meta", public=True),
        Route(
            "GET",
            "/ui/static/{name:.+}",
            dashboard.asset,
            "The dashboard's scripts and styles",
            "dashboard",
            public=True,
        ),
        Route(
            "GET",
            "/ui/api/snapshot",
            dashboard.snapshot,
            "The dashboard's state now, with trends",
            "dashboard",
        ),
        Route(
            "GET",
            "/ui/api/live",
            dashboard.live,
            "Server-sent events: the dashboard state each second; ?tail=room:NAME or topic:NAME:P follows",
            "dashboard",
        ),
        Route(
            "GET",
            "/ui/api/vpns",
            dashboard.vpns,
            "The Message VPNs the VPN picker offers this token (an operator's: every one)",
            "dashboard",
        ),
        Route(
            "GET",
            "/ui/api/browse",
            dashboard.browse,
            "Events for the message browser: ?target=, ?from_offset= or ?timestamp_ms=, ?limit=",
            "dashboard",
        ),
        Route("GET", "/ui", dashboard.page, "The dashboard", "dashboard", public=True),
        Route(
            "GET",
            "/ui/{page:(?!static/|api/).*}",
            dashboard.page,
            "The dashboard's pages",
            "dashboard",
            public=True,
        ),
        Route(
            "POST",
            "/api/v1/command",
            api.command,
            "Synap command endpoint (stream.*, pubsub.*; also topic.*, group.*)",
            "command",
            {"command": "string", "request_id": "string", "payload": "object"},
        ),
        Route(
            "GET",
            "/api/v1/ws",
            api.command_ws,
            "WebSocket: the command endpoint's envelopes, one per text frame, answered in order",
            "command",
        ),
        Route("GET", "/stream/list", api.room_list, "List rooms", "rooms"),
        Route(
            "POST",
            "/stream/{room}",
            api.room_create,
            "Create a room (409 if it exists)",
            "rooms",
            {"max_events": "integer", "retention_secs": "number"},
        ),
        Route(
            "PUT",
            "/stream/{room}",
            api.room_get_or_create,
            "Get or create a room",
            "rooms",
            {"max_events": "integer", "retention_secs": "number"},
        ),
        Route(
            "PUT",
            "/stream/{room}/retention",
            api.room_retention,
            "Change a room's limits (left out: unchanged; retention_secs null: no time limit)",
            "rooms",
            {"max_events": "integer", "retention_secs": "number"},
        ),
        Route("DELETE", "/stream/{room}", api.room_delete, "Delete a room and its history", "rooms"),
        Route(
            "POST",
            "/stream/{room}/publish",
            api.room_publish,
            "Publish an event; returns its offset",
            "rooms",
            {"event": "string", "event_type": "string", "data": "any", "metadata": "object"},
        ),
        Route(
            "GET",
            "/stream/{room}/consume/{subscriber_id}",
            api.room_consume,
            "Read events from ?from_offset= (negative: the last N), ?limit=",
            "rooms",
        ),
        Route(
            "GET",
            "/stream/{room}/history",
            api.room_history,
            "History between ?from_offset= and ?to_offset=, ?limit=",
            "rooms",
        ),
        Route("GET", "/stream/{room}/stats", api.room_stats, "Room statistics", "rooms"),
        Route(
            "GET",
            "/stream/{room}/ws/{subscriber_id}",
            api.room_ws,
            "WebSocket: replay from ?from_offset= then push events as they are published",
            "rooms",
        ),
        Route(
            "GET",
            "/events/{room}",
            api.room_sse,
            "Server-sent events of a room (Last-Event-ID resumes)",
            "rooms",
        ),
        Route(
            "POST",
            "/pubsub/{topic}/publish",
            api.pubsub_publish,
            "Publish a pub/sub message",
            "pubsub",
            {"payload": "any", "metadata": "object"},
        ),
        Route("GET", "/pubsub/topics", api.pubsub_topics, "Topics published so far", "pubsub"),
        Route(
            "GET",
            "/pubsub/ws",
            api.pubsub_ws,
            "WebSocket: messages of ?topics=a,b (wildcards * and #)",
            "pubsub",
        ),
        Route("GET", "/topics", api.topic_list, "List partitioned topics", "topics"),
        Route(
            "POST",
            "/topics/{topic}",
            api.topic_create,
            "Create a partitioned topic",
            "topics",
            {
                "num_partitions": "integer",
                "replication_factor": "integer",
                "retention_policy": "object",
                "segment_bytes": "integer",
            },
        ),
        Route(
            "PUT",
            "/topics/{topic}/retention",
            api.topic_retention,
            "Change a topic's retention (a shorter one deletes whole segments at the next pass)",
            "topics",
            {"retention_policy": "object"},
        ),
        Route("DELETE", "/topics/{topic}", api.topic_delete, "Delete a topic and its data", "topics"),
        Route(
            "POST",
            "/topics/{topic}/partitions",
            api.topic_partitions,
            "Grow a topic to num_partitions (never shrinks)",
            "topics",
            {"num_partitions": "integer"},
        ),
        Route(
            "POST",
            "/topics/{topic}/publish",
            api.topic_publish,
            "Publish one event (key routes by crc32(key) % partitions) or a batch ({events: [...]})",
            "topics",
            {
                "event_type": "string",
                "key": "string",
                "key_base64": "string",
                "data": "any",
                "metadata": "object",
                "partition": "integer",
                "events": "array",
                "idempotency_key": "string",
            },
        ),
        Route(
            "POST",
            "/topics/{topic}/staged",
            staging.stage,
            "Stage chunk seq of a task attempt's rows until its commit (a repeated seq stores nothing)",
            "topics",
            {"stage": "string", "seq": "integer", "events": "array"},
        ),
        Route(
            "POST",
            "/topics/{topic}/staged/commit",
            staging.commit,
            "Append exactly the stages named (each must hold the chunks and events given), once per key",
            "topics",
            {"idempotency_key": "string", "stages": "array"},
        ),
        Route(
            "POST",
            "/topics/{topic}/staged/abort",
            staging.abort,
            "Drop stages (a writer's aborted attempts)",
            "topics",
            {"stages": "array"},
        ),
        Route(
            "POST",
            "/topics/{topic}/partitions/{partition}/consume",
            api.topic_consume,
            "Read a partition from an offset",
            "topics",
            {"from_offset": "integer", "limit": "integer"},
        ),
        Route(
            "GET",
            "/topics/{topic}/partitions/{partition}/records",
            api.topic_records,
            "Raw records from ?from_offset= (up to ?max_bytes=) for bulk consumers; "
            "X-Log-Start-Offset / X-Log-End-Offset headers",
            "topics",
        ),
        Route(
            "GET",
            "/topics/{topic}/partitions/{partition}/records/location",
            api.topic_records_location,
            "Where .../records would read from (segment file path, position, length, device, "
            "inode; log start and end offsets): for readers on the server's host",
            "topics",
        ),
        Route("GET", "/topics/{topic}/stats", api.topic_stats, "Per-partition statistics", "topics"),
        Route(
            "GET",
            "/topics/{topic}/readers",
            api.readers.list,
            "Readers that keep their own position (Spark queries): their offsets and lag",
            "topics",
        ),
        Route(
            "PUT",
            "/topics/{topic}/readers/{reader}",
            api.readers.record,
            "Record where a reader is (a read-only view for lag: nothing moves for it)",
            "topics",
            body={"offsets": "object"},
        ),
        Route(
            "GET",
            "/topics/{topic}/offsets",
            api.topic_offsets_for_time,
            "Per partition, the first offset stamped at or after ?timestamp_ms= (the end when none is)",
            "topics",
        ),
        Route("GET", "/consumer-groups", api.groups.list, "List consumer groups", "groups"),
        Route(
            "POST",
            g,
            api.groups.create,
            "Create a consumer group",
            "groups",
            {
                "topic": "string",
                "partition_count": "integer",
                "strategy": "string",
                "session_timeout_secs": "number",
            },
        ),
        Route("DELETE", g, api.groups.delete, "Delete a consumer group and its offsets", "groups"),
        Route(
            "POST",
            g + "/join",
            api.groups.join,
            "Join: returns member_id, generation and partitions",
            "groups",
            {"member_id": "string", "session_timeout_secs": "number"},
        ),
        Route(
            "GET",
            g + "/members/{member}/assignment",
            api.groups.assignment,
            "A member's partitions in the current generation",
            "groups",
        ),
        Route(
            "POST",
            g + "/members/{member}/heartbeat",
            api.groups.heartbeat,
            "Keep a member alive; returns the generation (changed: fetch the assignment)",
            "groups",
        ),
        Route(
            "DELETE",
            g + "/members/{member}/leave",
            api.groups.leave,
            "Leave the group (rebalances)",
            "groups",
        ),
        Route(
            "POST",
            g + "/offsets/commit",
            api.groups.commit,
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
            api.groups.offset,
            "A partition's committed offset",
            "groups",
        ),
        Route("GET", g + "/stats", api.groups.stats, "Group state, members, generation, lag", "groups"),
    ]
    return table
