"""The mesh as the dashboard draws it across nodes and clusters: each mesh node registers its HTTP
address in discovery (``v1/mesh_nodes/<cluster>/<node>``, on the server's lease), and the dashboard
of any node reads every registered node's ``GET /mesh`` and keeps what the view needs: links and
their interest counts, gateways, queues, spools and the mate.

Other nodes are asked without credentials: this server's tokens are never sent to an address that
anyone who can write to discovery could have put there. A node that requires a token says so
instead of its status."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from meshplane.discovery.base import Discovery
from meshplane.errors import MeshplaneError
from meshplane.mesh.node import MeshNode

log = logging.getLogger(__name__)

MESH_NODES_BUCKET = "v1/mesh_nodes"
MAX_NODES = 64  # nodes asked per refresh
MAX_STATUS_BYTES = 4 << 20  # a node's answer read at most
MAX_ASKED_AT_ONCE = 8  # answers read and parsed at once (each up to MAX_STATUS_BYTES)
MAX_DRAWN = 200  # links, gateways, queues and spools kept of each node's answer
ASK_TIMEOUT_SECS = 2.0


def node_key(cluster: str, node: str) -> str:
    return f"{MESH_NODES_BUCKET}/{cluster}/{node}"


def node_record(node: str, cluster: str, url: str) -> bytes:
    return json.dumps({"node": node, "cluster": cluster, "url": url}).encode()


def parse_node_record(value: bytes) -> dict[str, str] | None:
    """A registered node's ``{node, cluster, url}``; None for a record that is not one."""
    try:
        record = json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict) or not all(
        isinstance(record.get(k), str) for k in ("node", "cluster", "url")
    ):
        return None
    if _origin(record["url"]) is None:
        return None
    return {k: record[k] for k in ("node", "cluster", "url")}


def _origin(url: str) -> str | None:
    """``scheme://host[:port]`` of a node's address; None for anything more (a path, a query, a
    fragment, credentials: whoever wrote the record would choose what this server fetches)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.rstrip("/").endswith(("?", "#")):
        return None
    return f"{parts.scheme}://{parts.netloc}"


async def register_node(discovery: Discovery, node: str, cluster: str, url: str) -> None:
    """Put this node in discovery for the mesh view (a failure only leaves it out of the view)."""
    try:
        await discovery.start()
        await discovery.register(node_key(cluster, node), node_record(node, cluster, url))
    except (MeshplaneError, OSError) as exc:
        log.warning("this node is not in the dashboard's mesh view: discovery refused it (%s)", exc)


def summary(status: dict[str, Any]) -> dict[str, Any]:
    """What the mesh view shows of one node's ``GET /mesh``."""
    guaranteed = status.get("guaranteed") or {}
    return {
        "links": [
            {k: link.get(k) for k in ("peer", "state", "patterns_remote", "events_out", "events_in")}
            for link in status.get("links", [])[:MAX_DRAWN]
        ],
        "gateways": [
            {
                "cluster": g.get("cluster"),
                "state": g.get("state"),
                "patterns_remote": g.get("patterns_remote"),
                "spooled": (g.get("spool") or {}).get("pending", 0),
            }
            for g in status.get("gateways", [])[:MAX_DRAWN]
        ],
        "queues": [
            {k: q.get(k) for k in ("name", "stored", "paused")}
            for q in guaranteed.get("queues", [])[:MAX_DRAWN]
        ],
        "spools": [
            {k: s.get(k) for k in ("peer", "pending")} for s in guaranteed.get("spools", [])[:MAX_DRAWN]
        ],
        "patterns_local": (status.get("interest") or {}).get("patterns_local"),
        "mate": {k: (status.get("mate") or {}).get(k) for k in ("state", "standby")}
        if status.get("mate")
        else None,
    }


async def _ask(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with session.get(f"{_origin(url)}/mesh", allow_redirects=False) as response:
            if response.status in (401, 403):
                return {"error": f"{response.status}: it requires a token (this view sends none)"}
            if response.status != 200:
                return {"error": f"GET /mesh answered {response.status}"}
            body = bytearray()
            while chunk := await response.content.read(MAX_STATUS_BYTES + 1 - len(body)):
                body += chunk  # read() answers what has arrived, not all it was asked for
                if len(body) > MAX_STATUS_BYTES:
                    return {"error": "its status is larger than the view reads"}
            return summary(json.loads(body))
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError, TypeError) as exc:
        return {"error": f"not reached: {exc or type(exc).__name__}"}


async def read_mesh_view(discovery: Discovery, own: MeshNode | None) -> list[dict[str, Any]] | None:
    """Every registered node (at most MAX_NODES), by cluster and node (``own``, this server's node,
    is shown without asking itself over HTTP); None when discovery does not answer."""
    try:
        async with asyncio.timeout(ASK_TIMEOUT_SECS):
            records = await discovery.list(MESH_NODES_BUCKET + "/")
    except (MeshplaneError, TimeoutError, OSError):
        return None
    nodes = [r for r in map(parse_node_record, records.values()) if r is not None]
    nodes = sorted(nodes, key=lambda r: (r["cluster"], r["node"]))[:MAX_NODES]
    timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_SECS)
    asking = asyncio.Semaphore(MAX_ASKED_AT_ONCE)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(record: dict[str, str]) -> dict[str, Any]:
            if own is not None and (record["cluster"], record["node"]) == (own.config.cluster, own.node_id):
                return {**record, "self": True, **summary(own.status())}
            async with asking:
                return {**record, **await _ask(session, record["url"])}

        return list(await asyncio.gather(*map(one, nodes)))
