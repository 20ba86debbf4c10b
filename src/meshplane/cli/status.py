"""``meshplane status``: is everything this shell's configuration points at up? (like ``nats server check``)

Checks discovery, NATS (when the plane uses it), the mesh node (when the plane is ``mesh``), the
brokers of broker mode, the streams server (when a URL is known), and, for a context of
``meshplane up``, its Spark pipeline and mesh nodes. Every service that takes credentials is asked
something that needs them (NATS's CONNECT, the mesh's secret and certificates, a streams route that
needs a read token), so a wrong token is found here, not by the next command. Prints one line per
check; exits 0 when all are up, 3 when something is unreachable, 4 when credentials were refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.parse
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshplane import context
from meshplane.cli.errors import EXIT_AUTH, EXIT_UNREACHABLE
from meshplane.cli.options import add_plane_options, add_token_option, config_from_args
from meshplane.cli.up_state import RUNNING_FILE, read_running
from meshplane.config import PlaneConfig
from meshplane.core.names import EVENT_CHANNELS_BUCKET
from meshplane.core.urls import redact_url
from meshplane.errors import AuthError, MeshplaneError, TransportError

TIMEOUT = 3.0


@dataclass
class Check:
    name: str
    target: str
    state: str  # ok | down | auth | skipped
    detail: str


def add_status_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=None, help="streams server to check (default: the context's, if any)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per check")
    add_token_option(parser, "MESHPLANE_STREAMS_TOKEN", "the streams server's token (default: the context's)")
    add_plane_options(parser)


async def _timed(check: str, target: str, probe: Coroutine[Any, Any, str]) -> Check:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(TIMEOUT + 2):  # the probes time out first, saying why
            detail = await probe
    except AuthError as exc:
        return Check(check, target, "auth", str(exc))
    except (MeshplaneError, OSError, TimeoutError) as exc:
        return Check(check, target, "down", str(exc) or type(exc).__name__)
    return Check(check, target, "ok", f"{detail} ({(time.perf_counter() - started) * 1000:.0f} ms)")


async def _discovery(config: PlaneConfig) -> str:
    from meshplane.discovery import create_discovery

    if config.discovery_backend == "file" and not config.file_kv.is_dir():  # not created by a check
        return "0 publisher record(s): the folder does not exist yet"
    discovery = create_discovery(config)
    await discovery.start()
    try:
        records = await discovery.list(EVENT_CHANNELS_BUCKET + "/")
    finally:
        await discovery.close()
    return f"{len(records)} publisher record(s)"


async def _nats(config: PlaneConfig) -> str:
    from meshplane.transports.nats import connect_nats

    client = await connect_nats(config.nats_server, TIMEOUT, tls=config.nats_tls())
    try:
        v = client.connected_server_version
        return f"connected, nats-server {v.major}.{v.minor}.{v.patch}"
    finally:
        await client.close()


async def _tcp(endpoint: str) -> str:
    parts = urllib.parse.urlsplit(endpoint)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.close()
    return "accepts connections"


async def _streams(url: str, token: str | None) -> str:
    import aiohttp

    from meshplane.cli.streams import refused_certificate
    from meshplane.streams.client import StreamsClient

    async with StreamsClient(url, token=token, timeout=TIMEOUT) as client:
        try:
            health = await client.request("GET", "/health")  # public: what runs there
        except aiohttp.ClientConnectorCertificateError as exc:
            raise TransportError(await refused_certificate(url, exc)) from None
        await client.request("GET", "/topics")  # needs a read token where tokens are required
    served = f"{health.get('status')}, {health.get('service')} {health.get('version', '')}".strip()
    return f"{served}, {'token accepted' if token else 'no token needed'}"


async def _mesh_route(config: PlaneConfig) -> str:
    """The node a ``mesh`` plane talks to: its handshake proves the secret, TLS checks both sides."""
    from meshplane.mesh.client import MeshClient

    client = MeshClient(config.mesh_node, timeout=TIMEOUT, tls=config.mesh_tls(), name="status")
    await client.connect()
    try:
        proven = "secret proven" if client.secret else "no secret"
        return f"node {client.node}, {proven}{', TLS' if client.tls is not None else ''}"
    finally:
        await client.close()


async def _mesh_node(url: str, token: str | None) -> str:
    from meshplane.streams.client import StreamsClient

    async with StreamsClient(url, token=token, timeout=TIMEOUT) as client:
        status = await client.request("GET", "/mesh")
    links = status["links"]
    up = sum(1 for link in links if link["state"] == "up")
    forwarded = status["counters"]["messages_forwarded"]
    return f"node {status['node']}: {up}/{len(links)} links up, {forwarded} forwarded"


def _pipeline(found: dict[str, Any], state_dir: Path) -> Check:
    state, log = str(found.get("state")), str(found.get("log") or state_dir / "pipeline.log")
    restarts = int(found.get("restarts") or 0)
    if state == "running":
        detail = f"pid {found.get('pid')}" + (
            f", restarted {restarts}x (last: {found.get('reason')})" if restarts else ""
        )
        return Check("pipeline", log, "ok", detail)
    if state == "finished":
        return Check("pipeline", log, "ok", "finished")
    return Check("pipeline", log, "down", f"{state}: {found.get('reason')} (restarts {restarts})")


async def _up_checks(state_dir: Path, token: str | None) -> list[Check]:
    """The pipeline and mesh nodes of the `meshplane up` whose context this is (its up.json)."""
    running = read_running(state_dir)
    if not running:
        return [Check("up", str(state_dir), "down", f"no {RUNNING_FILE}: its meshplane up is not running")]
    if not context.process_alive(int(running.get("pid") or 0)):  # killed: its up.json stayed behind
        return [
            Check("up", str(state_dir), "down", f"its meshplane up (pid {running.get('pid')}) has stopped")
        ]
    checks = []
    found = running.get("pipeline")
    if isinstance(found, dict):
        checks.append(_pipeline(found, state_dir))
    else:
        checks.append(Check("pipeline", "-", "skipped", "this meshplane up runs no pipeline"))
    for node in running.get("mesh_nodes") or []:
        url = str(node.get("url"))
        checks.append(await _timed(f"mesh {node.get('id')}", url, _mesh_node(url, token)))
    return checks


async def run_status(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    checks: list[Check] = []
    selected = context.current()
    if selected is not None:
        checks.append(Check("context", selected.name, "ok", selected.description or "selected"))
    where = {"file": str(config.file_kv), "etcd": ",".join(config.etcd_endpoints)}.get(
        config.discovery_backend, ""
    )
    checks.append(await _timed("discovery", f"{config.discovery_backend}:{where}", _discovery(config)))
    if config.event_plane == "nats":
        checks.append(await _timed("nats", redact_url(config.nats_server), _nats(config)))
    if config.event_plane == "mesh":
        checks.append(await _timed("mesh node", config.mesh_node, _mesh_route(config)))
    for broker in config.zmq_brokers:
        for side, endpoint in (("xsub", broker.xsub), ("xpub", broker.xpub)):
            checks.append(await _timed(f"broker {side}", endpoint, _tcp(endpoint)))
    url = args.url or context.environment().get("MESHPLANE_STREAMS_URL")
    token = args.token or context.environment().get("MESHPLANE_STREAMS_TOKEN")
    if url:
        checks.append(await _timed("streams", url, _streams(url, token)))
    else:
        checks.append(Check("streams", "-", "skipped", "no --url, MESHPLANE_STREAMS_URL or context"))
    state_dir = context.environment().get("MESHPLANE_STATE_DIR")
    if state_dir:
        checks += await _up_checks(Path(state_dir), token)
    for check in checks:
        if args.json:
            print(json.dumps(asdict(check)))
        else:
            print(f"{check.name:<11} {check.state:<8} {check.target:<40} {check.detail}")
    states = {c.state for c in checks}
    return EXIT_AUTH if "auth" in states else EXIT_UNREACHABLE if "down" in states else 0
