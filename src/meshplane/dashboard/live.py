"""The dashboard's live state: sampled once a second for everyone, sent to every open page.

Counters and lag are sampled every tick whether or not a page is open (a few dictionary reads), so
a page opened now shows the last minutes. The full state (tables, lag in time, the event plane) is
built only while pages are open, once per tick for all of them, and encoded once: a page costs the
server one write a second. A page that reads slower than that gets the newest state, never a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from meshplane.core.brokers import BROKERS_BUCKET, parse_broker_record
from meshplane.core.keys import key_to_json
from meshplane.core.names import EVENT_CHANNELS_BUCKET
from meshplane.dashboard.meshview import read_mesh_view
from meshplane.dashboard.model import Trends, first_at_or_after, readable, scope_tree
from meshplane.discovery.base import Discovery
from meshplane.discovery.channels import parse_channel
from meshplane.errors import MeshplaneError
from meshplane.mesh.node import MeshNode
from meshplane.streams.errors import LimitReached, NotFound, StreamError
from meshplane.streams.events import StreamEvent
from meshplane.streams.grants import Grant
from meshplane.streams.readers import Readers, ReaderView, reader_lag
from meshplane.streams.service import StreamsService

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()

MAX_VIEWERS = 64
MAX_LISTED = 200  # topics, rooms and groups in one state; the page says how many more exist
TAIL_EVENTS = 100  # events sent to a tailing page per tick
PLANE_EVERY = 5.0  # seconds between discovery listings and broker queries


def sse(event: str, body: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + body + b"\n\n"


@dataclass(frozen=True, slots=True)
class Tail:
    """Events a page follows live: a room, or a topic's partition, from ``next_offset`` on."""

    kind: str
    name: str
    partition: int | None
    next_offset: int


@dataclass(eq=False)
class Viewer:
    """One open page: the newest frame not yet written, and what it may see."""

    grant: Grant | None
    tail: Tail | None = None
    pending: list[bytes] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    @property
    def sees_everything(self) -> bool:
        return self.grant is None or any(s.prefix == "" for s in self.grant.scopes)

    def may_read(self, name: str) -> bool:
        return self.grant is None or self.grant.allows("read", [name])

    def may_see_series(self, name: str) -> bool:
        """Totals (``in``) are for everyone; ``topic:NAME``, ``room:NAME``, ``lag:GROUP`` by name."""
        _, colon, owner = name.partition(":")
        return not colon or self.may_read(owner)

    def offer(self, frame: bytes, *, replace: bool) -> None:
        if replace:  # a newer state supersedes one not yet written; tail events never do
            self.pending = [f for f in self.pending if not f.startswith(b"event: state")]
        self.pending.append(frame)
        self.wakeup.set()

    async def frames(self, heartbeat: float) -> list[bytes]:
        """What to write next (an SSE comment after ``heartbeat`` seconds of nothing)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(heartbeat):
                await self.wakeup.wait()
        self.wakeup.clear()
        frames, self.pending = self.pending, []
        return frames or [b": keep-alive\n\n"]


class Dashboard:
    def __init__(
        self,
        engine: StreamsService,
        *,
        mesh: MeshNode | None = None,
        discovery: Discovery | None = None,
        tick: float = 1.0,
        clock: Callable[[], float] = time.time,
        readers: Readers | None = None,
    ) -> None:
        self.engine, self.mesh, self.discovery = engine, mesh, discovery
        # Spark queries' progress, as the HTTP API recorded it
        self.readers = readers if readers is not None else Readers()
        self.tick_secs, self.clock = tick, clock
        self.started_at = clock()
        self.trends = Trends()
        self.viewers: set[Viewer] = set()
        self.fsyncs: deque[float] = deque(maxlen=1024)
        self.plane: dict[str, Any] = {"discovery": discovery is not None}
        self._plane_at = 0.0
        self._plane_task: asyncio.Task[None] | None = None
        self._lag_stamps: dict[tuple[str, int], tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._points: dict[str, float] = {}
        self.errors = 0

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="dashboard")

    async def close(self) -> None:
        for task in (self._task, self._plane_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for viewer in self.viewers:
            viewer.closed = True
            viewer.wakeup.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # a bug here must not stop the server, nor the next tick
                self.errors += 1
                log.exception("dashboard tick failed")
            await asyncio.sleep(self.tick_secs)

    def observe_fsync(self, seconds: float) -> None:
        self.fsyncs.append(seconds)

    # --- pages ---------------------------------------------------------------------------------------

    def join(self, grant: Grant | None, tail: Tail | None = None) -> Viewer:
        if len(self.viewers) >= MAX_VIEWERS:
            raise LimitReached(f"{MAX_VIEWERS} dashboard pages are open (the limit)", "dashboard_pages")
        viewer = Viewer(grant, tail)
        self.viewers.add(viewer)
        self._refresh_plane()
        return viewer

    def leave(self, viewer: Viewer) -> None:
        self.viewers.discard(viewer)

    def hello(self, viewer: Viewer) -> bytes:
        """The first frame of a page: the state now and the trends it is allowed to see."""
        now = self.clock()
        state = self.state(now)
        if not viewer.sees_everything:
            state = _filtered(state, viewer)
        state["history"] = self.trends.export(n for n in self.trends.series if viewer.may_see_series(n))
        return sse("state", _json.encode(state))

    # --- one tick ------------------------------------------------------------------------------------

    async def tick(self) -> None:
        now = self.clock()
        self._sample(now)
        if not self.viewers:
            return
        self._refresh_plane()
        state = self.state(now)
        shared = sse("state", _json.encode(state))
        for viewer in self.viewers:
            frame = shared if viewer.sees_everything else sse("state", _json.encode(_filtered(state, viewer)))
            viewer.offer(frame, replace=True)
            if viewer.tail is not None:
                await self._send_tail(viewer)

    def _sample(self, now: float) -> None:
        e = self.engine
        counters = {
            "in": e.counters["events_published"],
            "out": e.counters["events_consumed"] + e.pubsub.delivered + self.readers.events_read,
            "bytes_in": e.counters["bytes_published"],
            "bulk_out": e.counters["bytes_read_in_bulk"],
        }
        for room in itertools.islice(e.rooms.values(), MAX_LISTED):
            counters["room:" + room.name] = room.published
        for topic in itertools.islice(e.topics.values(), MAX_LISTED):
            counters["topic:" + topic.name] = sum(topic.published)
        points = self.trends.rates(now, counters)
        lags: dict[str, int] = {}
        for group, _, lag in e.lag():
            lags[group] = lags.get(group, 0) + lag
        for group, lag in list(lags.items())[:MAX_LISTED]:
            points["lag:" + group] = float(lag)
        self.trends.record(now, points)
        self._points = points

    # --- the state -----------------------------------------------------------------------------------

    def state(self, now: float) -> dict[str, Any]:
        e = self.engine
        groups = [self._group(name, now) for name in sorted(e.groups)[:MAX_LISTED]]
        lag_by_topic: dict[str, list[dict[str, Any]]] = {}
        for group in groups:
            lag_by_topic.setdefault(group["topic"], []).append({"group": group["group"], "lag": group["lag"]})
        return {
            "t": now,
            "overview": self._overview(now),
            "topics": [
                self._topic(name, lag_by_topic.get(name, [])) for name in sorted(e.topics)[:MAX_LISTED]
            ],
            "rooms": [self._room(name) for name in sorted(e.rooms)[:MAX_LISTED]],
            "groups": groups,
            "readers": [self._reader(view, now) for view in itertools.islice(self.readers, MAX_LISTED)],
            "more": {
                "topics": max(0, len(e.topics) - MAX_LISTED),
                "rooms": max(0, len(e.rooms) - MAX_LISTED),
                "groups": max(0, len(e.groups) - MAX_LISTED),
            },
            "plane": self.plane,
            "mesh": self.mesh.status() if self.mesh is not None else None,
            "points": self._points,
        }

    def _overview(self, now: float) -> dict[str, Any]:
        e = self.engine
        fsyncs = sorted(self.fsyncs)
        rooms_bytes = sum(r.stored_bytes for r in e.rooms.values())
        topics_bytes = sum(p.size_bytes for t in e.topics.values() for p in t.partitions)
        return {
            "events_in_per_sec": self._points.get("in", 0.0),
            "events_out_per_sec": self._points.get("out", 0.0),
            "bytes_in_per_sec": self._points.get("bytes_in", 0.0),
            "bulk_bytes_out_per_sec": self._points.get("bulk_out", 0.0),  # Spark reads no events one by one
            "bytes_stored": rooms_bytes + topics_bytes,
            "connections": {
                "room_subscribers": sum(len(r.pushers) for r in e.rooms.values()),
                "pubsub_listeners": len(e.pubsub.listeners),
                "dashboards": len(self.viewers),
            },
            "uptime_secs": now - self.started_at,
            "fsync_ms": {
                "p50": statistics.median(fsyncs) * 1000 if fsyncs else None,
                "p99": fsyncs[int(len(fsyncs) * 0.99)] * 1000 if fsyncs else None,
                "count": e.durability.fsyncs,
                "errors": e.durability.fsync_errors,
                "policy": e.config.fsync,
            },
            "counters": dict(e.counters),
            "storage_problems": len(e.storage_problems()),
            "dashboard_tick_errors": self.errors,  # logged with their tracebacks
        }

    def _topic(self, name: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
        topic = self.engine.topics[name]
        partitions = [
            {
                "partition": p,
                "first": plog.start_offset,
                "next": plog.next_offset,
                "bytes": plog.size_bytes,
                "published": topic.published[p],
            }
            for p, plog in enumerate(topic.partitions)
        ]
        return {
            "name": name,
            "partitions": partitions,
            "events": sum(p["next"] - p["first"] for p in partitions),
            "bytes": sum(p["bytes"] for p in partitions),
            "retention": topic.settings.retention.to_json(),
            "rate": self._points.get("topic:" + name, 0.0),
            "groups": groups,
        }

    def _room(self, name: str) -> dict[str, Any]:
        room = self.engine.rooms[name]
        return {
            "name": name,
            "first": room.oldest,
            "next": room.next_offset,
            "events": len(room),
            "bytes": room.stored_bytes,
            "max_events": room.max_events,
            "retention_secs": room.retention_secs,
            "live_subscribers": len(room.pushers),
            "rate": self._points.get("room:" + name, 0.0),
        }

    def _group(self, name: str, now: float) -> dict[str, Any]:
        group = self.engine.groups[name]  # the service's view (on JetStream too: not the local store's)
        topic = self.engine.topics.get(group.topic)
        owners = {p: member for member, parts in group.assignment.items() for p in parts}
        partitions = []
        for p in range(group.partitions):
            plog = topic.partitions[p] if topic is not None and p < len(topic.partitions) else None
            end = plog.next_offset if plog is not None else None
            committed = group.committed.get(p)
            at = committed if committed is not None else (plog.start_offset if plog is not None else 0)
            lag = max(0, end - at) if end is not None else None
            partitions.append(
                {
                    "partition": p,
                    "committed": committed,
                    "end": end,
                    "lag": lag,
                    "lag_ms": self._lag_ms(name, p, at, now) if lag else 0,
                    "member": owners.get(p),
                }
            )
        ages = [p["lag_ms"] for p in partitions if p["lag_ms"] is not None]
        return {
            "group": name,
            "topic": group.topic,
            "state": group.state,
            "generation": group.generation,
            "strategy": group.strategy,
            "members": [{"id": m, "partitions": group.assignment.get(m, [])} for m in sorted(group.members)],
            "partitions": partitions,
            "lag": sum(p["lag"] or 0 for p in partitions),
            "lag_ms": max(ages, default=0),
        }

    def _reader(self, view: ReaderView, now: float) -> dict[str, Any]:
        """A reader's lag as the groups' (its time lag keyed apart from any group's name)."""
        topic = self.engine.topics.get(view.topic)
        partitions = topic.partitions if topic is not None else []
        lags = reader_lag(view, partitions)
        at = {p: view.offsets.get(p, partitions[p].start_offset) for p, lag in lags.items() if lag}
        age = max(
            (self._lag_ms(f"reader {view.name}", p, o, now, view.topic) or 0 for p, o in at.items()),
            default=0,
        )
        row = {"reader": view.name, "topic": view.topic, "lag": sum(lags.values()), "lag_ms": age}
        row |= {"owner": view.owner, "identity": view.identity}
        return {**row, "updated_secs_ago": max(0.0, now - view.updated_at)}

    def _lag_ms(
        self, group: str, partition: int, offset: int, now: float, topic_name: str = ""
    ) -> int | None:
        """How long the oldest unconsumed event has waited: its stamp, read once per offset."""
        key = (group, partition)
        known = self._lag_stamps.get(key)
        if known is None or known[0] != offset:
            topic = self.engine.topic_store.topics.get(topic_name or self.engine.groups[group].topic)
            if topic is None or not self.engine.local_files:  # a remote log: not read on every tick
                return None
            try:
                records = topic.partitions[partition].read(offset, 1)
            except (OSError, StreamError):
                return None
            if not records:
                return None
            if len(self._lag_stamps) >= MAX_LISTED * 64:
                self._lag_stamps.clear()
            known = self._lag_stamps[key] = (offset, records[0].timestamp_ms)
        return max(0, int(now * 1000) - known[1])

    # --- the event plane -----------------------------------------------------------------------------

    def _refresh_plane(self) -> None:
        now = time.monotonic()
        busy = self._plane_task is not None and not self._plane_task.done()
        if self.discovery is None or busy or now - self._plane_at < PLANE_EVERY:
            return
        self._plane_at = now
        self._plane_task = asyncio.create_task(self._read_plane(self.discovery), name="dashboard-plane")

    async def _read_plane(self, discovery: Discovery) -> None:
        plane: dict[str, Any] = {"discovery": True, "checked_at": self.clock()}
        try:
            async with asyncio.timeout(3.0):
                channels = await discovery.list(EVENT_CHANNELS_BUCKET + "/")
                brokers = await discovery.list(BROKERS_BUCKET + "/")
        except (MeshplaneError, TimeoutError, OSError) as exc:
            self.plane = {**self.plane, "error": f"discovery did not answer: {exc or 'timeout'}"}
            return
        parsed, invalid = [], 0
        for key, value in channels.items():
            try:
                parsed.append(parse_channel(key, value))
            except MeshplaneError:
                invalid += 1
        plane["publishers"] = len(parsed)
        plane["invalid_records"] = invalid
        plane["tree"] = scope_tree(parsed)
        plane["brokers"] = [await self._broker(key, value) for key, value in sorted(brokers.items())[:32]]
        self.plane = {**plane, "mesh_nodes": await read_mesh_view(discovery, self.mesh)}

    async def _broker(self, key: str, value: bytes) -> dict[str, Any]:
        from meshplane.broker import query_stats  # pyzmq: only when brokers are registered

        try:
            address = parse_broker_record(value)
        except MeshplaneError as exc:
            return {"key": key, "error": str(exc)}
        found: dict[str, Any] = {"key": key, "xsub": address.xsub, "xpub": address.xpub}
        stats_endpoint = msgspec.json.decode(value).get("stats")
        if isinstance(stats_endpoint, str):
            try:
                found["counters"] = await asyncio.to_thread(query_stats, stats_endpoint, 1.0)
            except MeshplaneError as exc:
                found["error"] = str(exc)
        return found

    # --- tails and the message browser ----------------------------------------------------------------

    async def _send_tail(self, viewer: Viewer) -> None:
        tail = viewer.tail
        assert tail is not None
        try:
            events = await self.read(tail.kind, tail.name, tail.partition, tail.next_offset, TAIL_EVENTS)
        except StreamError as exc:
            viewer.offer(sse("tail-error", _json.encode({"error": str(exc)})), replace=False)
            viewer.tail = None
            return
        if events:
            viewer.tail = Tail(tail.kind, tail.name, tail.partition, events[-1]["offset"] + 1)
            viewer.offer(sse("tail", _json.encode(events)), replace=False)

    async def read(
        self, kind: str, name: str, partition: int | None, from_offset: int, limit: int
    ) -> list[dict[str, Any]]:
        """Events for the browser, without counting them as consumed."""
        if kind == "room":
            room = self.engine.room(name)
            start = max(from_offset, room.oldest)
            if start >= room.next_offset:
                return []
            return [_shown(ev) for ev in room.read(start, limit)]
        p = _partition(self.engine, name, partition)
        plog = self.engine.topic(name).partitions[p]
        start = max(from_offset, plog.start_offset)
        if start >= plog.next_offset:
            return []
        return [_shown(ev) for ev in await self.engine.read_topic(name, p, start, limit, counted=False)]

    def bounds(self, kind: str, name: str, partition: int | None) -> tuple[int, int]:
        if kind == "room":
            room = self.engine.room(name)
            return room.oldest, room.next_offset
        plog = self.engine.topic(name).partitions[_partition(self.engine, name, partition)]
        return plog.start_offset, plog.next_offset

    async def offset_at(self, kind: str, name: str, partition: int | None, timestamp_ms: int) -> int:
        if kind == "topic":
            offsets = await self.engine.offsets_for_time(name, timestamp_ms)
            return offsets[_partition(self.engine, name, partition)]
        room = self.engine.room(name)
        return first_at_or_after(
            room.oldest, room.next_offset, lambda o: room.read(o, 1)[0].timestamp_ms, timestamp_ms
        )


def _partition(engine: StreamsService, name: str, partition: int | None) -> int:
    count = len(engine.topic(name).partitions)
    if partition is None or not 0 <= partition < count:
        raise NotFound(f"topic {name!r} has partitions 0..{count - 1}, not {partition}")
    return partition


def _shown(event: StreamEvent) -> dict[str, Any]:
    body = event.body
    return {
        "offset": event.offset,
        "timestamp_ms": event.timestamp_ms,
        "id": body.id,
        "event_type": body.event_type,
        **key_to_json(body.key),
        "size": event.size,
        "metadata": body.metadata or {},
        "payload": readable(body.data),
    }


def _filtered(state: dict[str, Any], viewer: Viewer) -> dict[str, Any]:
    """The state as a token limited to some names sees it: only those, and no event plane or mesh."""
    shown = dict(state)
    shown["topics"] = [t for t in state["topics"] if viewer.may_read(t["name"])]
    shown["rooms"] = [r for r in state["rooms"] if viewer.may_read(r["name"])]
    shown["groups"] = [g for g in state["groups"] if viewer.may_read(g["group"])]
    shown["points"] = {k: v for k, v in state["points"].items() if viewer.may_see_series(k)}
    shown["plane"], shown["mesh"] = {"discovery": False, "hidden": True}, None
    return shown
