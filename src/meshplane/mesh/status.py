"""A node as ``GET /mesh`` shows it: interest, clients, counters, frame errors, links."""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any

from meshplane.mesh.links import Link, link_status

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode


def node_status(node: MeshNode, patterns: bool, limit: int) -> dict[str, Any]:
    router = node.router
    routed = node.routed
    answer: dict[str, Any] = {
        "node": node.node_id,
        "cluster": node.config.cluster,
        "route_url": node.route_url,
        "epoch": node.epoch,
        "interest": {
            "version": router.own.version,
            "patterns_local": len(router.own.holders),
            "subscriptions_local": router.local_subscriptions,
            "subscriptions_remote": router.remote_subscriptions,
            "topics_active": router.topics_active,
        },
        "clients": [
            {
                "id": session.client_id,
                "vpn": session.vpn,
                "user": session.user,
                "patterns": router.count_of(session),
                "delivered": session.delivered,
                "queued": len(session.queue),
                "buffered_bytes": session.conn.buffered_bytes(),
                "paused": session.conn.paused,
                "dropped": session.dropped,
            }
            for session in itertools.islice(node.clients.sessions.values(), limit)
        ],
        "counters": {
            "messages_routed": routed,
            "messages_forwarded": node.forwarded,
            "fanout_avg": round(node.deliveries / routed, 3) if routed else 0.0,
            "duplicates_dropped": node.dedup.duplicates,
            "direct_path_events": node.direct.events,  # of those routed, the ones the C direct path took
            **{k: v for k, v in node.counters.items() if k not in ("messages_routed", "messages_forwarded")},
        },
        "vpns": node.logins.status(),
        "vpns_reload": node.logins.reloads.status(),
        "frame_errors": dict(node.frame_errors),
        "limits": dataclasses.asdict(node.config.limits),
        "partial_bytes": dataclasses.asdict(node.partial),
        "links": [_link(node, link) for link in sorted(node.links.values(), key=lambda link: link.peer)],
        "gateways": node.gateways.status(),
        "guaranteed": {
            "enabled": node.guaranteed.enabled,
            "counters": dict(node.guaranteed.counters),
            "queues": node.guaranteed.queues.status(),
            "spools": node.guaranteed.spool_status(),
        },
        "mate": node.mirror.status() if node.mirror is not None else None,
        "mqtt": node.mqtt.status(limit) if node.mqtt is not None else None,
        "nats": node.nats.status(limit) if node.nats is not None else None,
        "imports": node.imports.status(),
    }
    if patterns:
        answer["patterns"] = {
            "local": sorted(router.own.holders)[:limit],
            "peers": {peer: sorted(state.interest.versions)[:limit] for peer, state in router.peers.items()},
            "gateways": node.gateways.patterns(limit),
        }
    return answer


def _link(node: MeshNode, link: Link) -> dict[str, Any]:
    peer_state = node.router.peers.get(link.peer)
    remote = len(peer_state.interest.versions) if peer_state is not None else 0
    return link_status(link, remote, node.router.bloom_false_positives[link.peer])
