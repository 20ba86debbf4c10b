"""The routes of readers' progress (a Spark query's committed offsets): a read-only view for lag."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from meshplane.errors import BadRequest
from meshplane.streams.config import check_name
from meshplane.streams.http.params import GRANT, json_response, read_json
from meshplane.streams.readers import Readers, ReaderView, reader_lag
from meshplane.streams.service import StreamsService
from meshplane.streams.topics import TopicBase


def describe(view: ReaderView, topic: TopicBase[Any], now: float) -> dict[str, Any]:
    lag = reader_lag(view, topic.partitions)
    return {
        "reader": view.name,
        "topic": view.topic,
        "offsets": {str(p): o for p, o in sorted(view.offsets.items())},
        "lag": {str(p): n for p, n in lag.items()},
        "lag_total": sum(lag.values()),
        "updated_secs_ago": round(max(0.0, now - view.updated_at), 3),
        "owner": view.owner,
        "identity": view.identity,
    }


class ReaderApi:
    def __init__(self, engine: StreamsService, readers: Readers) -> None:
        self.engine, self.readers = engine, readers

    async def record(self, request: web.Request) -> web.Response:
        topic = self.engine.topic(request.match_info["topic"])
        name = check_name("reader", request.match_info["reader"])
        body = await read_json(request)
        raw, identity = body.get("offsets"), body.get("identity", "")
        if not isinstance(identity, str):
            raise BadRequest("identity must be a string (how the reader's name was chosen)")
        partitions = len(topic.partitions)
        if not isinstance(raw, dict) or not all(
            isinstance(p, str) and p.isdigit() and int(p) < partitions and type(o) is int and o >= 0
            for p, o in raw.items()
        ):
            raise BadRequest(
                f"offsets must be an object of partitions (0..{partitions - 1}) to offsets >= 0, "
                'like {"0": 42}'
            )
        grant = request.get(GRANT)
        owner = grant.holder if grant is not None else ""
        offsets = {int(p): o for p, o in raw.items()}
        ends = [log.next_offset for log in topic.partitions]
        self.readers.record(topic.name, name, offsets, time.time(), owner, identity, ends)
        return json_response({"success": True, "topic": topic.name, "reader": name})

    async def list(self, request: web.Request) -> web.Response:
        topic = self.engine.topic(request.match_info["topic"])
        now = time.time()
        views = [describe(view, topic, now) for view in self.readers.of_topic(topic.name)]
        return json_response({"topic": topic.name, "readers": views, "count": len(views)})
