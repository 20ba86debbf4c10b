"""``meshplane serve``: the aiohttp application (authentication, errors, routes) and the server loop.

Synap-compatible: the command endpoint ``POST /api/v1/command`` that synap-sdk uses over http://,
the room REST routes and WebSockets, and the topic / consumer-group REST routes."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import nats.errors
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram

from meshplane.core.mesh.vpn import DEFAULT
from meshplane.dashboard.http import DASHBOARD, DASHBOARDS
from meshplane.dashboard.live import Dashboard
from meshplane.discovery.base import Discovery
from meshplane.mesh.node import MeshNode
from meshplane.mesh.vpns import Vpns, streams_limits
from meshplane.streams.access import Tokens
from meshplane.streams.errors import (
    Forbidden,
    NotFound,
    PayloadTooLarge,
    StorageError,
    StreamError,
)
from meshplane.streams.grants import Grant
from meshplane.streams.http import origin
from meshplane.streams.http.api import Api
from meshplane.streams.http.mesh import MESH, register_mesh_metrics
from meshplane.streams.http.metrics import REGISTRY, EngineCollector
from meshplane.streams.http.params import (
    ENGINE,
    ENGINES,
    GRANT,
    VPN,
    VPN_HEADER,
    Handler,
    error_response,
    json_response,
    vpn_of,
)
from meshplane.streams.http.routes import route_table
from meshplane.streams.http.vpn_bridge import attach_vpn
from meshplane.streams.http.vpn_queues import queue_commands, renamed, to_vpn_queue
from meshplane.streams.service import StreamsService
from meshplane.streams.vpn_engines import VpnEngines

log = logging.getLogger(__name__)

QUEUES = "/mesh/queues"  # the mesh routes a VPN's token may use, on its VPN's queues
_NAMED = ("room", "topic", "group", "name")  # the path's names a token's prefixes apply to

# --- the application -------------------------------------------------------------------------------


def create_app(
    engine: StreamsService,
    *,
    tokens: Tokens | None = None,
    max_request_bytes: int | None = None,
    mesh: MeshNode | None = None,
    discovery: Discovery | None = None,
    loopback_only: bool = False,
    engines: VpnEngines | None = None,
) -> web.Application:
    """``loopback_only``: the server listens on loopback, so it answers only requests addressed to a
    loopback name (:mod:`.origin`). ``engines``: the streams service of each Message VPN its tokens
    name (``engine`` is the default VPN's); a request reaches only its token's VPN's."""
    engines = engines if engines is not None else VpnEngines(engine)
    limit = max_request_bytes or max(engine.config.max_payload_bytes * 2, 1 << 20)
    apis = {vpn: Api(each) for vpn, each in engines.items()}
    tables = {vpn: route_table(api) for vpn, api in apis.items()}
    routes = tables[DEFAULT]
    for vpn, api in apis.items():
        if mesh is not None and vpn != DEFAULT:  # its mesh queues' groups, by the command channel too
            api.commands.queue_route = queue_commands(vpn, api.engine, apis[DEFAULT].commands)
    by_key = {(r.method, r.path): r for r in routes}

    @web.middleware
    async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = origin.refusal(request.method, request.headers, loopback_only)
        if refused is not None:
            return error_response(Forbidden(refused))
        resource = request.match_info.route.resource
        route = by_key.get((request.method, resource.canonical if resource is not None else request.path))
        if tokens is not None and route is not None and not route.public:
            grant = _grant(request, tokens, query=route.browser)
            if grant is None:
                return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})
            if route.tag == "mesh" and grant.vpn != DEFAULT and not route.path.startswith(QUEUES):
                # The node's links and VPNs are the default VPN's operators' (a VPN's own queues are its).
                return error_response(Forbidden(f"a token of the VPN {grant.vpn} may not manage the mesh"))
            names = [request.match_info[k] for k in _NAMED if k in request.match_info]
            if route.access is not None and not grant.allows(route.access, names or [None]):
                return error_response(Forbidden(f"this token may not {route.access} {', '.join(names)}"))
            request[GRANT] = grant
        chosen = _vpn(request, engines)
        if isinstance(chosen, StreamError):
            return error_response(chosen)
        request[VPN] = chosen
        try:
            renames = await to_vpn_queue(request, route.path, route.access) if route is not None else []
            if renames:
                request[VPN] = DEFAULT  # the VPN's queue's topic and groups are in the default VPN's service
            response = await handler(request)
            return renamed(response, renames) if renames else response
        except StreamError as exc:
            apis[vpn_of(request)].commands.note(exc)
            return error_response(exc)
        except web.HTTPRequestEntityTooLarge as exc:
            return error_response(PayloadTooLarge(f"request body too large: {exc.text}"))
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.empty_body is False:
                return json_response(
                    {"error": exc.reason, "code": exc.status, "type": "HttpError"}, exc.status
                )
            raise
        except (OSError, nats.errors.Error) as exc:  # a store or server that failed under the request
            log.warning("%s %s: %r", request.method, request.path, exc)
            return error_response(StorageError(f"storage unavailable ({exc!r}); retry"))
        except Exception:  # a bug: still an answer a client can parse, and the traceback in the log
            log.exception("%s %s failed", request.method, request.path)
            return json_response({"error": "internal error", "code": 500, "type": "InternalError"}, 500)

    app = web.Application(middlewares=[errors_and_auth], client_max_size=limit)
    app[ENGINE] = engine
    app[ENGINES] = engines
    registry = CollectorRegistry()
    labelled = len(engines) > 1  # a server that names no VPN keeps its metrics' names and labels
    for vpn, api in apis.items():
        refused = api.commands.refused
        queues = [each for each in engines if each != DEFAULT] if mesh is not None and vpn == DEFAULT else []
        collector = EngineCollector(
            api.engine, api.readers.readers, vpn=vpn if labelled else None, refused=refused, queue_vpns=queues
        )
        registry.register(collector)
    fsync_hist = Histogram(
        "meshplane_fsync_seconds",
        "fsync latency (group commit)",
        registry=registry,
        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    )
    dashboards = {
        vpn: Dashboard(
            api.engine,
            mesh=mesh if vpn == DEFAULT else None,
            discovery=discovery if vpn == DEFAULT else None,
            readers=api.readers.readers,
        )
        for vpn, api in apis.items()
    }
    dashboard = app[DASHBOARD] = dashboards[DEFAULT]
    app[DASHBOARDS] = dashboards

    def on_fsync(seconds: float) -> None:
        fsync_hist.observe(seconds)
        dashboard.observe_fsync(seconds)

    for each in engines.values():
        each.durability.on_fsync = on_fsync
    app[REGISTRY] = registry
    if mesh is not None:
        app[MESH] = mesh
        register_mesh_metrics(mesh, registry)
    for n, route in enumerate(routes):
        handler = route.handler
        if len(tables) > 1:
            handler = _by_vpn({vpn: table[n].handler for vpn, table in tables.items()})
        app.router.add_route(route.method, route.path, handler)
    return app


def _vpn(request: web.Request, engines: VpnEngines) -> str | StreamError:
    """The VPN the request works in: its token's, or the one an operator names in the header."""
    grant: Grant | None = request.get(GRANT)
    own = DEFAULT if grant is None else grant.vpn
    asked = request.headers.get(VPN_HEADER, own)
    if asked == own:
        return own
    if grant is None:  # a public route's: answering by the VPN would tell which VPNs exist
        return Forbidden(f"only the operator's token picks a Message VPN ({VPN_HEADER})")
    if not grant.operator:
        return Forbidden(f"a token of the VPN {own} works in its VPN only, not in {asked[:40]!r}")
    if asked not in engines:
        return NotFound(f"no Message VPN {asked[:40]!r} on this server's streams side")
    return asked


def _by_vpn(handlers: dict[str, Handler]) -> Handler:
    """A route's handler that answers with the request's VPN's service (and no other's)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await handlers[vpn_of(request)](request)

    return handle


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
    mesh: MeshNode | None = None,
    discovery: Discovery | None = None,
    vpns: Vpns | None = None,
) -> None:
    """Run until ``stop`` is set (or forever); as a node of the event mesh when ``mesh`` is given.
    The dashboard's event plane page lists the publishers in ``discovery``, when given. Each Message
    VPN a token names gets its own streams service (:mod:`meshplane.streams.vpn_engines`), held to
    the limits its section of ``vpns`` (the VPN file) sets, and to those of each reload of it."""
    limits = streams_limits(vpns) if vpns is not None else None
    engines = VpnEngines(engine, tokens.vpns() if tokens is not None else (), limits)
    for each in engines.values():
        # An HA mate's copy of a VPN's writes (under the data directory) before each acknowledgement.
        each.durability.replicate = engine.durability.replicate
        await each.start()
    if mesh is not None:
        mesh.logins.reloads.applied.append(lambda new: engines.limit(streams_limits(new)))
        mesh.attach(engine)
        for vpn, each in engines.others().items():
            attach_vpn(mesh, each, vpn)
        await mesh.start()
    app = create_app(
        engine,
        tokens=tokens,
        mesh=mesh,
        discovery=discovery,
        loopback_only=origin.is_loopback_name(host),
        engines=engines,
    )
    for dashboard in app[DASHBOARDS].values():
        dashboard.start()
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
        for dashboard in app[DASHBOARDS].values():
            await dashboard.close()
        if mesh is not None:
            await mesh.close()
        await runner.cleanup()
        for each in engines.values():
            await each.close()
