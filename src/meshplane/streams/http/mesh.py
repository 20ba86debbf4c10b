"""A mesh node's side of the streams server: ``GET /mesh`` (nodes, links, interest, counters) and its
Prometheus metrics, under seed 004's names."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from meshplane.core.mesh.vpn import DEFAULT, queue_topic
from meshplane.mesh.doors.mqtt_metrics import MqttCollector
from meshplane.mesh.links import LINK_COUNTERS
from meshplane.mesh.node import MeshNode
from meshplane.mesh.queues import queue_status
from meshplane.mesh.vpn_metrics import VpnCollector
from meshplane.streams.errors import BadRequest, Conflict, Forbidden, NotFound
from meshplane.streams.grants import Grant
from meshplane.streams.http.params import (
    ENGINE,
    ENGINES,
    GRANT,
    json_response,
    read_json,
    readable,
    vpn_of,
)

MESH: web.AppKey[MeshNode] = web.AppKey("mesh", MeshNode)


def _node(request: web.Request) -> MeshNode:
    node = request.app.get(MESH)
    if node is None:
        raise NotFound("this server is not a mesh node: start it with --node-id (and --routes to link it)")
    return node


async def mesh_status(request: web.Request) -> web.Response:
    status = _node(request).status(patterns=request.query.get("patterns") in ("1", "true"))
    if vpn_of(request) != DEFAULT:  # a VPN's request sees its VPN's queues only, named as it names them
        status["guaranteed"]["queues"] = _vpn_queues(request, status["guaranteed"]["queues"])
    if request.get(GRANT) is not None:  # a token sees the subjects and queues of its prefixes only
        status["guaranteed"]["queues"] = _readable_queues(request, status["guaranteed"]["queues"])
        for where, patterns in status.get("patterns", {}).items():
            if isinstance(patterns, list):
                status["patterns"][where] = readable(request, patterns)
            else:
                status["patterns"][where] = {peer: readable(request, p) for peer, p in patterns.items()}
    return json_response(status)


def _readable_queues(request: web.Request, queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = set(readable(request, [queue["name"] for queue in queues]))
    return [queue for queue in queues if queue["name"] in names]


def _vpn_queues(request: web.Request, queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The queues of the request's VPN beyond the default, named as its clients name them."""
    vpn = vpn_of(request)
    cut = len(queue_topic(vpn, ""))
    return [{**queue, "name": queue["name"][cut:]} for queue in queues if queue["vpn"] == vpn]


async def queues_list(request: web.Request) -> web.Response:
    """The node's queues: every VPN's for the default VPN's requests (each named by its topic,
    ``A:orders``), only its own for a request of VPN ``A`` (named ``orders``)."""
    queues = _node(request).guaranteed.queues.status()
    if vpn_of(request) != DEFAULT:
        queues = _vpn_queues(request, queues)
    return json_response({"queues": _readable_queues(request, queues)})


def _queue_vpn(request: web.Request, asked: object) -> str:
    """The VPN whose queue a request manages: its own, unless the default VPN's operator (or a
    server without tokens) names another in the body's or query's ``vpn``."""
    own = vpn_of(request)
    if asked is None or asked == own:
        return own
    if not isinstance(asked, str):
        raise BadRequest('"vpn" must be a VPN\'s name')
    grant: Grant | None = request.get(GRANT)
    if own != DEFAULT or (grant is not None and not grant.operator):
        raise Forbidden(f"this token manages the queues of the VPN {own} only, not of {asked[:40]!r}")
    return asked


async def queue_put(request: web.Request) -> web.Response:
    """Make a queue (a guaranteed subscription): ``{"patterns": ["orders.>"]}``, in the request's VPN
    (the default VPN's operator may name another: ``"vpn": "team-a"``). Its events are read from the
    topic it names (``topic``: as the request's VPN names it)."""
    body = await read_json(request)
    patterns, vpn = body.get("patterns"), _queue_vpn(request, body.get("vpn"))
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise BadRequest('body must be {"patterns": ["a.pattern", ...]}')
    name = request.match_info["name"]
    own = vpn_of(request)
    if own != DEFAULT and name in request.app[ENGINES][own].topics:
        raise Conflict(f"the VPN {own} has a topic {name!r} of its own: a queue needs another name")
    queue = await _node(request).guaranteed.queues.make(name, patterns, vpn)
    topic = name if own != DEFAULT else queue.name
    return json_response(
        {"name": name, "vpn": vpn, "patterns": queue_status(queue)["patterns"], "topic": topic}
    )


async def queue_delete(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if not _node(request).guaranteed.queues.delete(name, _queue_vpn(request, request.query.get("vpn"))):
        raise NotFound(f"queue {name!r} not found")
    return json_response({"deleted": name})


async def queue_pause(request: web.Request) -> web.Response:
    """Pause a queue: it keeps storing, its topic's readers get nothing until it is resumed."""
    return await _pause(request, True)


async def queue_resume(request: web.Request) -> web.Response:
    return await _pause(request, False)


async def _pause(request: web.Request, paused: bool) -> web.Response:
    name = request.match_info["name"]  # the default VPN's: the topic's name (``A:orders`` for A's)
    queue = _node(request).guaranteed.queues.pause(queue_topic(vpn_of(request), name), paused)
    replicate = request.app[ENGINE].durability.replicate
    if replicate is not None:  # an HA mate's standby has it before the answer: a takeover keeps it
        await replicate()
    return json_response({"name": name, "paused": queue.paused})


async def vpns_reload(request: web.Request) -> web.Response:
    """Read the node's VPN file again (as SIGHUP): 200 with what changed, or 400 with every mistake
    (the node keeps its VPNs as they were)."""
    outcome = _node(request).logins.reloads.reload()
    if not outcome["ok"]:
        raise BadRequest("the VPN file was not applied: " + "; ".join(outcome["problems"]))
    return json_response(outcome)


async def node_forget(request: web.Request) -> web.Response:
    """Forget a departed node: its interest, its spool (events it never confirmed) and its queues."""
    peer = request.match_info["node"]
    try:
        return json_response(_node(request).forget(peer))
    except KeyError:
        raise NotFound(f"node {peer!r} is not known here") from None
    except ValueError as exc:
        raise Conflict(str(exc)) from None


def register_mesh_metrics(node: MeshNode, registry: CollectorRegistry) -> None:
    registry.register(MeshCollector(node))
    registry.register(VpnCollector(node))
    if node.mqtt is not None:
        registry.register(MqttCollector(node.mqtt))
    latency = Histogram(
        "meshplane_mesh_routing_latency_seconds",
        "Time to route one event published on this node (local deliveries and link sends)",
        registry=registry,
        buckets=(1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2),
    )
    node.on_latency = latency.observe


class MeshCollector(Collector):
    def __init__(self, node: MeshNode) -> None:
        self.node = node

    def collect(self) -> Any:
        status = self.node.status()
        counters, interest = status["counters"], status["interest"]
        prefix = "meshplane_mesh_"
        yield CounterMetricFamily(
            prefix + "messages_routed", "Events routed", value=counters["messages_routed"]
        )
        yield CounterMetricFamily(
            prefix + "messages_forwarded", "Event copies sent to peers", value=counters["messages_forwarded"]
        )
        yield GaugeMetricFamily(
            prefix + "fanout_avg",
            "Copies (local deliveries and links) per routed event",
            value=counters["fanout_avg"],
        )
        yield CounterMetricFamily(
            prefix + "duplicates_dropped",
            "Events seen before (dedup cache)",
            value=counters["duplicates_dropped"],
        )
        for name, help_text in (
            ("subscriptions_local", "Subscriptions of this node's clients"),
            ("subscriptions_remote", "Patterns peers advertised"),
            ("topics_active", "Patterns with a subscriber here or at a peer"),
        ):
            yield GaugeMetricFamily(prefix + name, help_text, value=interest[name])
        per_link = {
            name: CounterMetricFamily(
                f"{prefix}link_{name}", f"Per link: {name.replace('_', ' ')}", labels=["peer"]
            )
            for name in (
                *LINK_COUNTERS,
                "events_out",
                "events_in",
                "bytes_in",
                "bytes_out",
                "batches_out",
                "bloom_false_positives",
            )
        }
        state = GaugeMetricFamily(prefix + "link_up", "1 while the link carries events", labels=["peer"])
        for link in status["links"]:
            for name, family in per_link.items():
                family.add_metric([link["peer"]], link[name])
            state.add_metric([link["peer"]], 1 if link["state"] == "up" else 0)
        yield from per_link.values()
        yield state
        external = {
            name: CounterMetricFamily(
                f"{prefix}gateway_{name}", f"Per external link: {name}", labels=["cluster"]
            )
            for name in ("events_out", "events_in", "dropped_peer_down", "sub_add_in", "resyncs")
        }
        external_up = GaugeMetricFamily(
            prefix + "gateway_up", "1 while the external link is up", labels=["cluster"]
        )
        for gateway in status["gateways"]:
            for name, family in external.items():
                family.add_metric([gateway["cluster"]], gateway[name])
            external_up.add_metric([gateway["cluster"]], 1 if gateway["state"] == "up" else 0)
        yield from external.values()
        yield external_up
        spooled = GaugeMetricFamily(
            prefix + "spool_pending", "Guaranteed events spooled for a peer, unconfirmed", labels=["peer"]
        )
        for spool in status["guaranteed"]["spools"]:
            spooled.add_metric([spool["peer"]], spool["pending"])
        yield spooled
        crossing = GaugeMetricFamily(
            prefix + "gateway_spool_pending",
            "Guaranteed events spooled for another cluster, not yet confirmed",
            labels=["cluster"],
        )
        for gateway in status["gateways"]:
            crossing.add_metric([gateway["cluster"]], (gateway["spool"] or {}).get("pending", 0))
        yield crossing
        errors = CounterMetricFamily(
            prefix + "frames_dropped", "Frames dropped, by reason", labels=["reason"]
        )
        for reason, count in status["frame_errors"].items():
            errors.add_metric([reason], count)
        yield errors
        closed = CounterMetricFamily(
            prefix + "connections_closed",
            "Connections closed for passing a limit, by reason",
            labels=["reason"],
        )
        for name, count in counters.items():
            if name.startswith("closed_"):
                closed.add_metric([name[len("closed_") :]], count)
        yield closed
        for name, value in status["limits"].items():
            help_text = f"Per connection: {name.replace('_', ' ')}"
            yield GaugeMetricFamily(f"{prefix}limit_{name}", help_text, value=value)
        yield from vpn_metrics(prefix, status["vpns"])
        if self.node.nats is not None:
            yield from self.node.nats.metrics(prefix)


def vpn_metrics(prefix: str, vpns: dict[str, dict[str, Any]]) -> Any:
    """Each Message VPN's clients and subscriptions on this node, and what it refused."""
    clients = GaugeMetricFamily(
        prefix + "vpn_clients", "Clients of a Message VPN on this node", labels=["vpn"]
    )
    subscriptions = GaugeMetricFamily(
        prefix + "vpn_subscriptions", "Patterns a Message VPN's clients hold on this node", labels=["vpn"]
    )
    logins = CounterMetricFamily(prefix + "vpn_logins_refused", "Logins refused", labels=["vpn"])
    busy = CounterMetricFamily(
        prefix + "vpn_logins_busy",
        "Logins refused unchecked: the password checks' queue was full",
        labels=["vpn"],
    )
    violations = CounterMetricFamily(
        prefix + "vpn_violations",
        "Publishes and subscriptions a user's permissions refused",
        labels=["vpn", "user"],
    )
    limits = CounterMetricFamily(
        prefix + "vpn_limits_refused",
        "Connections and subscriptions a VPN's limits refused",
        labels=["vpn", "limit"],
    )
    for name, vpn in vpns.items():
        clients.add_metric([name], vpn["clients"])
        subscriptions.add_metric([name], vpn["subscriptions"])
        logins.add_metric([name], vpn["logins_refused"])
        busy.add_metric([name], vpn["logins_busy"])
        for user, count in vpn["violations"].items():
            violations.add_metric([name, user], count)
        for limit, count in vpn["limits_refused"].items():
            limits.add_metric([name, limit], count)
    yield from (clients, subscriptions, logins, busy, violations, limits)
