"""A Message VPN's mesh queues as its streams token sees them: topics and consumer groups.

VPN ``A``'s queue ``orders`` is stored in the default VPN's streams service as the topic ``A:orders``
(:func:`meshplane.core.mesh.vpn.queue_topic`), and a consumer group ``A``'s token makes on it as the
group ``A:workers`` beside it. A token of ``A`` names both as ``A``'s clients do (``orders``,
``workers``): the app's middleware points such a request at the default VPN's service under the
stored names (:func:`to_vpn_queue`) and renames them back in the answer (:func:`renamed`); its
``group.*`` commands go the same way (:func:`queue_commands`). ``A``'s own
topics and groups come first: a name that is both goes to ``A``'s own. Nothing here reaches another
VPN's queue: the stored names are made from the request's VPN, never read from it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import msgspec
from aiohttp import web

from meshplane.core.mesh.vpn import DEFAULT, queue_topic
from meshplane.streams.errors import Conflict
from meshplane.streams.groups import check_new_group
from meshplane.streams.http.commands import Commands, QueueRoute
from meshplane.streams.http.mesh import MESH
from meshplane.streams.http.params import ENGINE, ENGINES, read_json, vpn_of
from meshplane.streams.service import StreamsService

_json = msgspec.json.Encoder()
STORED_TOPIC = "meshplane.stored_topic"  # a group made on a VPN's queue: the topic it is stored as
GROUP_LIMIT = "meshplane.group_limit"  # ... and the VPN's groups it counts with, and their limit
_GROUP = "/consumer-groups/{group}"

Renames = list[tuple[str, str, str]]  # (JSON key, stored name, the VPN's name)


def queue_topics(request: web.Request) -> list[str]:
    """The topics of the request's VPN's queues on this node, by the VPN's names (none for the
    default VPN: its queues' topics are its own)."""
    vpn, node = vpn_of(request), request.app.get(MESH)
    if vpn == DEFAULT or node is None:
        return []
    cut, topics = queue_topic(vpn, ""), request.app[ENGINE].topics
    return [n[len(cut) :] for n in node.guaranteed.queues.queues if n.startswith(cut) and n in topics]


def queue_groups(request: web.Request) -> list[str]:
    """The consumer groups made on the request's VPN's queues, by the VPN's names."""
    vpn = vpn_of(request)
    if vpn == DEFAULT or request.app.get(MESH) is None:
        return []
    cut = queue_topic(vpn, "")
    groups = request.app[ENGINE].groups
    return [g[len(cut) :] for g, group in groups.items() if g.startswith(cut) and group.topic.startswith(cut)]


def counted_groups(request: web.Request, engine: StreamsService) -> tuple[Collection[str], int] | None:
    """The groups a new group of ``request`` counts with and their limit: a VPN's on its queues its
    VPN's (:func:`_new_group`); the default VPN's its own, less those of the VPNs' stored beside them
    (at most each VPN's limit of them: a name that merely looks like one is counted)."""
    limit: tuple[Collection[str], int] | None = request.get(GROUP_LIMIT)
    if limit is not None or vpn_of(request) != DEFAULT or request.app.get(MESH) is None:
        return limit
    own = dict.fromkeys(engine.groups)
    for vpn, its in request.app[ENGINES].items():
        if vpn == DEFAULT:
            continue
        cut = queue_topic(vpn, "")
        theirs = [
            g for g, group in engine.groups.items() if g.startswith(cut) and group.topic.startswith(cut)
        ]
        for name in theirs[: its.config.max_groups]:
            del own[name]
    return list(own), engine.config.max_groups


def _stored_queue(request: web.Request, name: object) -> str | None:
    """The stored topic of the request's VPN's queue ``name``, unless the VPN has a topic of that name
    (a request of a VPN beyond the default, on a mesh node)."""
    vpn = vpn_of(request)
    if not isinstance(name, str) or name in request.app[ENGINES][vpn].topics:
        return None
    stored = queue_topic(vpn, name)
    known = stored in request.app[MESH].guaranteed.queues.queues and stored in request.app[ENGINE].topics
    return stored if known else None


async def to_vpn_queue(request: web.Request, path: str, access: str | None) -> Renames:
    """Point a VPN's request on its queue's topic or a group of it at the default VPN's service,
    under the stored names: what to rename back in the answer (nothing: the request is the VPN's own)."""
    if vpn_of(request) == DEFAULT or request.app.get(MESH) is None:
        return []
    if path.startswith("/topics/{topic}") and access == "read":
        name = request.match_info["topic"]
        stored = _stored_queue(request, name)
        if stored is None:
            return []
        request.match_info["topic"] = stored
        return [("topic", stored, name)]
    if not path.startswith(_GROUP):
        return []
    if path == _GROUP and request.method == "POST":
        return await _new_group(request)
    vpn, group = vpn_of(request), request.match_info["group"]
    found = queue_group(vpn, group, request.app[ENGINES][vpn], request.app[ENGINE])
    if found is None:
        return []
    stored, topic = found
    request.match_info["group"] = stored
    return [("group_id", stored, group), ("topic", topic, topic[len(queue_topic(vpn, "")) :])]


def queue_group(
    vpn: str, group: object, own: StreamsService, default: StreamsService
) -> tuple[str, str] | None:
    """The stored names (group, topic) of the VPN's group ``group`` on one of its queues; None for a
    name of the VPN's own groups, or of no group on its queues."""
    if vpn == DEFAULT or not isinstance(group, str) or group in own.groups:
        return None
    cut = queue_topic(vpn, "")
    found = default.groups.get(cut + group)
    if found is None or not found.topic.startswith(cut):
        return None  # a default VPN's group that merely carries the prefix: not the VPN's
    return cut + group, found.topic


def queue_commands(vpn: str, own: StreamsService, default: Commands) -> QueueRoute:
    """The route of a VPN's ``group.*`` commands to its queues' groups, as :func:`to_vpn_queue` routes
    the REST routes: the default VPN's commands, under the stored names, answered by the VPN's."""

    def route(payload: dict[str, Any]) -> tuple[Commands, dict[str, Any], str] | None:
        found = queue_group(vpn, payload.get("group"), own, default.engine)
        if found is None:
            return None
        return default, {**payload, "group": found[0]}, payload["group"]

    return route


async def _new_group(request: web.Request) -> Renames:
    """A group made by a VPN's token: on its queue, stored beside the queue's topic; one name per VPN."""
    group = request.match_info["group"]
    stored = queue_topic(vpn_of(request), group)
    own = request.app[ENGINES][vpn_of(request)]
    body: dict[str, Any] = await read_json(request)  # read again by the handler, from aiohttp's copy
    topic = _stored_queue(request, body.get("topic"))
    if topic is None:
        if stored in request.app[ENGINE].groups:
            raise Conflict(f"consumer group {group!r} already exists (on one of the VPN's queues)")
        return []
    if group in own.groups:
        raise Conflict(f"consumer group {group!r} already exists")
    # Stored in the default VPN's service, counted against the VPN's own limit (and not the default's).
    counted = [*own.groups, *queue_groups(request)]
    check_new_group(counted, group, own.config.max_groups)
    request[GROUP_LIMIT] = (counted, own.config.max_groups)
    request[STORED_TOPIC] = topic
    request.match_info["group"] = stored
    return [("group_id", stored, group), ("topic", topic, str(body["topic"]))]


def renamed(response: web.StreamResponse, renames: Renames) -> web.StreamResponse:
    """An answer about a VPN's queue or its group, naming them as the VPN names them."""
    if isinstance(response, web.Response) and isinstance(response.body, bytes):
        body = response.body
        for key, stored, name in renames:
            field = _json.encode(key) + b":"
            body = body.replace(field + _json.encode(stored), field + _json.encode(name))
        response.body = body
    return response
