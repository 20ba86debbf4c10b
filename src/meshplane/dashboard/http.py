"""The dashboard's routes: the page and its assets (public: they hold no data), and the JSON and
live stream the page reads (a read token, sent in a header: never in a URL that gets logged)."""

from __future__ import annotations

import asyncio
import mimetypes
from importlib import resources
from typing import Any

from aiohttp import web

from meshplane.core.mesh.vpn import DEFAULT
from meshplane.dashboard.live import Dashboard, Tail
from meshplane.streams.errors import BadRequest, Forbidden
from meshplane.streams.grants import Grant
from meshplane.streams.http.params import GRANT, json_response, query_int, vpn_of

DASHBOARD: web.AppKey[Dashboard] = web.AppKey("dashboard", Dashboard)  # the default VPN's
DASHBOARDS = web.AppKey("dashboards", dict[str, Dashboard])  # each Message VPN's
HEARTBEAT_SECS = 15.0
WRITE_TIMEOUT_SECS = 30.0
MAX_BROWSE = 500

# The page's code comes only from this server; uPlot sets element styles from script.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _assets() -> dict[str, tuple[bytes, str]]:
    """Every file under ``static/``, read once: name -> (bytes, content type). Only these are served."""
    found: dict[str, tuple[bytes, str]] = {}
    root = resources.files("meshplane.dashboard") / "static"

    def walk(folder: Any, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            else:
                kind = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
                if entry.name.endswith(".js"):
                    kind = "text/javascript"
                found[prefix + entry.name] = (entry.read_bytes(), kind)

    walk(root, "")
    return found


ASSETS = _assets()


def _dashboard(request: web.Request) -> Dashboard:
    """The dashboard of the request's VPN (the picker's choice, for an operator)."""
    return request.app[DASHBOARDS][vpn_of(request)]


async def vpns(request: web.Request) -> web.Response:
    """The VPN picker's choices: every VPN for an operator (or without tokens), else the token's own."""
    grant = _grant(request)
    own = DEFAULT if grant is None else grant.vpn
    every = grant is None or grant.operator
    dashboards: dict[str, Dashboard] = request.app[DASHBOARDS]
    return json_response({"vpn": vpn_of(request), "vpns": sorted(dashboards) if every else [own]})


def _grant(request: web.Request) -> Grant | None:
    grant: Grant | None = request.get(GRANT)
    return grant


def _check_read(request: web.Request, name: str) -> None:
    grant = _grant(request)
    if grant is not None and not grant.allows("read", [name]):
        raise Forbidden(f"this token may not read {name}")


async def page(request: web.Request) -> web.Response:
    """The page, for ``/ui`` and every deep link under it (the page routes itself)."""
    body, _ = ASSETS["index.html"]
    return web.Response(
        body=body,
        content_type="text/html",
        charset="utf-8",
        headers={**_SECURITY_HEADERS, "Cache-Control": "no-cache"},
    )


async def asset(request: web.Request) -> web.Response:
    found = ASSETS.get(request.match_info["name"])
    if found is None or request.match_info["name"] == "index.html":
        raise web.HTTPNotFound()
    body, kind = found
    return web.Response(
        body=body, content_type=kind, headers={**_SECURITY_HEADERS, "Cache-Control": "max-age=300"}
    )


async def snapshot(request: web.Request) -> web.Response:
    """The state the live stream starts with, as one JSON document (for scripts and checks)."""
    dashboard = _dashboard(request)
    viewer = dashboard.join(_grant(request))
    try:
        frame = dashboard.hello(viewer)
    finally:
        dashboard.leave(viewer)
    return web.Response(body=frame.split(b"data: ", 1)[1].rstrip(b"\n"), content_type="application/json")


async def live(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``state`` once a second, and with ``?tail=`` new events of a room or of a
    topic's partition (``room:NAME``, ``topic:NAME:PARTITION``) from ``?from_offset=``."""
    dashboard = _dashboard(request)
    tail = _tail(request)
    viewer = dashboard.join(_grant(request), tail)
    try:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        await response.write(dashboard.hello(viewer))
        while not viewer.closed:
            frames = await viewer.frames(HEARTBEAT_SECS)
            async with asyncio.timeout(WRITE_TIMEOUT_SECS):  # a reader that stopped reading is let go
                await response.write(b"".join(frames))
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        dashboard.leave(viewer)
    return response


def _tail(request: web.Request) -> Tail | None:
    text = request.query.get("tail")
    if text is None:
        return None
    kind, name, partition = _target(text)
    _check_read(request, name)
    start, end = _dashboard(request).bounds(kind, name, partition)
    from_offset = query_int(request, "from_offset", end, minimum=0)
    return Tail(kind, name, partition, max(start, from_offset))


def _target(text: str) -> tuple[str, str, int | None]:
    kind, _, rest = text.partition(":")
    if kind == "room" and rest:
        return "room", rest, None
    name, _, partition = rest.rpartition(":")
    if kind == "topic" and name and partition.isdigit():
        return "topic", name, int(partition)
    raise BadRequest(f"tail must be room:NAME or topic:NAME:PARTITION, not {text!r}")


async def browse(request: web.Request) -> web.Response:
    """A page of events: ``?target=`` (as ``tail``) from ``?from_offset=`` or ``?timestamp_ms=``, or the
    last ``?limit=`` when neither is given."""
    dashboard = _dashboard(request)
    kind, name, partition = _target(request.query.get("target", ""))
    _check_read(request, name)
    limit = query_int(request, "limit", 50, minimum=1, maximum=MAX_BROWSE)
    start, end = dashboard.bounds(kind, name, partition)
    stamp = query_int(request, "timestamp_ms", None, minimum=0)
    if stamp is not None:
        from_offset = await dashboard.offset_at(kind, name, partition, stamp)
    else:
        from_offset = query_int(request, "from_offset", max(start, end - limit), minimum=0)
    events = await dashboard.read(kind, name, partition, from_offset, limit)
    return json_response(
        {
            "target": request.query["target"],
            "start": start,
            "end": end,
            "from_offset": from_offset,
            "events": events,
        }
    )
