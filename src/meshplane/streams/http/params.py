"""Request parsing and JSON answers, shared by the routes and the command endpoints."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import msgspec
from aiohttp import web

from meshplane.core.keys import key_from_json
from meshplane.core.mesh.vpn import DEFAULT
from meshplane.core.metadata import MetadataError, internal_entries, reserved_key
from meshplane.core.streamlog import StoredEvent
from meshplane.streams.config import new_event_id
from meshplane.streams.errors import (
    BadRequest,
    PayloadTooLarge,
    RequestTimeout,
    StreamError,
    http_status,
)
from meshplane.streams.grants import Grant
from meshplane.streams.service import StreamsService

_json = msgspec.json.Encoder()


ENGINE: web.AppKey[StreamsService] = web.AppKey("engine", StreamsService)  # the default VPN's
ENGINES: web.AppKey[Mapping[str, StreamsService]] = web.AppKey("engines")  # each VPN's, by name
GRANT = "meshplane.grant"  # the request's grant, when the server requires tokens
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_CONSUME_LIMIT = 1000
INT64_MAX = 2**63 - 1
_json_decoder = msgspec.json.Decoder()


VPN = "meshplane.vpn"  # the Message VPN a request works in (set by the app's middleware)
VPN_HEADER = "X-Meshplane-Vpn"  # an operator's choice of VPN (a token of another VPN: refused)


def vpn_of(request: web.Request) -> str:
    """The Message VPN a request works in: its token's (the default VPN without tokens), or the one
    an operator named in ``X-Meshplane-Vpn``."""
    vpn: str = request.get(VPN, DEFAULT)
    return vpn


def engine_of(request: web.Request) -> StreamsService:
    """The streams service of the request's VPN: the only one a request ever reaches."""
    return request.app[ENGINES][vpn_of(request)]


def readable(request: web.Request, names: Iterable[str]) -> list[str]:
    """The names the request's token may read (all of them without tokens): listings follow a token's
    prefixes, as the dashboard does."""
    grant: Grant | None = request.get(GRANT)
    if grant is None:
        return list(names)
    return [name for name in names if grant.allows("read", [name])]


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def error_body(exc: StreamError) -> dict[str, Any]:
    """``{"error", "code", "type"}`` and the error's details: what every error answer carries."""
    return {"error": str(exc), "code": http_status(exc), "type": exc.kind, **exc.details()}


def error_response(exc: StreamError) -> web.Response:
    return json_response(error_body(exc), http_status(exc))


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
    if value is None:  # null for an optional field: as if left out
        return default
    if value is default:
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
    if value is None and default is not _MISSING:  # null for an optional field: as if left out
        return default
    if value is not default and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string, not {value!r}")
    return value


def get_metadata(source: dict[str, Any]) -> dict[str, str] | None:
    """A producer's metadata, with the ``meshplane.*`` entries its ``encoding`` and ``headers``
    fields ask for (a ``meshplane.*`` key of its own is refused: they are the server's)."""
    metadata = source.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object of strings")
    reserved = reserved_key(metadata or {})
    if reserved is not None:
        raise BadRequest(
            f"metadata key {reserved[:100]!r} is reserved: meshplane.* keys are the server's (send binary "
            "data with encoding='base64', Kafka headers with headers=[[key, base64 value or null], ...])"
        )
    try:
        internal = internal_entries(source.get("encoding"), source.get("headers"), source.get("data"))
    except MetadataError as exc:
        raise BadRequest(str(exc)) from None
    if metadata is None and not internal:
        return None
    entries = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    return entries | internal


def event_type_of(source: dict[str, Any]) -> str:
    """Synap's SDK sends ``event``, the seed ``event_type``: accept both."""
    value = source.get("event_type", source.get("event"))
    if not isinstance(value, str) or not value:
        raise BadRequest("missing field 'event' (or 'event_type'): a non-empty string")
    return value


def query_int(request: web.Request, name: str, default: int | None = None, **bounds: int) -> Any:
    return get_int(dict(request.query), name, default, **bounds)


def topic_list(raw: object) -> list[str]:
    if isinstance(raw, str):
        raw = [t for t in raw.split(",") if t]
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) and t for t in raw):
        raise BadRequest("topics must be a non-empty list of topic patterns")
    return list(raw)


def positive(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise BadRequest(f"{name} must be a positive number, not {value!r}")
    return float(value)


def retention_secs_of(body: dict[str, Any]) -> float | None:
    return positive(body, "retention_secs")


def topic_event(item: dict[str, Any]) -> StoredEvent:
    if "data" not in item:
        raise BadRequest("missing field 'data'")
    try:
        key = key_from_json(item)
    except MetadataError as exc:
        raise BadRequest(str(exc)) from None
    return StoredEvent(new_event_id(), event_type_of(item), item["data"], key, get_metadata(item))
