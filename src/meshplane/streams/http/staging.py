"""The staged-write routes (a writer's commit protocol): thin adapters to the service.

``POST /topics/{topic}/staged`` keeps a task attempt's chunk, ``.../staged/commit`` appends exactly
the stages an attempt reported, once per idempotency key, ``.../staged/abort`` drops stages."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from meshplane.core.staging import Reported
from meshplane.streams.errors import BadRequest
from meshplane.streams.http.params import engine_of, get_int, get_str, json_response, read_json, topic_event
from meshplane.streams.staging import check_stage_id


async def stage(request: web.Request) -> web.Response:
    name, body = request.match_info["topic"], await read_json(request)
    stage_id = check_stage_id(body.get("stage"))
    seq = get_int(body, "seq", minimum=0)
    items = body.get("events")
    if not isinstance(items, list) or not items or not all(isinstance(e, dict) for e in items):
        raise BadRequest("events must be a non-empty list of objects")
    events = [(get_int(e, "partition", None, minimum=0), topic_event(e)) for e in items]
    stored = engine_of(request).stage(name, stage_id, seq, events)
    return json_response({"topic": name, "stage": stage_id, "seq": seq, "repeated": not stored})


def _reported(raw: Any) -> list[Reported]:
    if not isinstance(raw, list) or not all(isinstance(s, dict) for s in raw):
        raise BadRequest("stages must be a list of {stage, chunks, events}")
    return [
        Reported(
            check_stage_id(s.get("stage")), get_int(s, "chunks", minimum=0), get_int(s, "events", minimum=0)
        )
        for s in raw
    ]


async def commit(request: web.Request) -> web.Response:
    name, body = request.match_info["topic"], await read_json(request)
    reported = _reported(body.get("stages"))
    appended, count = await engine_of(request).commit_staged(name, get_str(body, "idempotency_key"), reported)
    return json_response({"topic": name, "committed": appended, "count": count})


async def abort(request: web.Request) -> web.Response:
    name, body = request.match_info["topic"], await read_json(request)
    stages = body.get("stages")
    if not isinstance(stages, list):
        raise BadRequest("stages must be a list of stage ids")
    dropped = engine_of(request).abort_staged(name, [check_stage_id(s) for s in stages])
    return json_response({"topic": name, "dropped": dropped})
