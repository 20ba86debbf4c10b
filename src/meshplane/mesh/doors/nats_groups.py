"""NATS queue groups on a node (the design: :mod:`meshplane.core.doors.nats_groups`): one holder per
(group, pattern), whatever number of this node's NATS clients are members of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meshplane.core.doors.nats_groups import chosen, marker
from meshplane.mesh.holders import MeshEvent

if TYPE_CHECKING:
    from meshplane.mesh.doors.nats import NatsDoor
    from meshplane.mesh.doors.nats_client import NatsClient


@dataclass(eq=False)
class QueueGroup:
    door: NatsDoor
    group: str
    pattern: str
    members: list[tuple[NatsClient, str]] = field(default_factory=list)  # (client, sid)
    turn: int = 0

    @property
    def marker(self) -> str:
        return marker(self.group, self.pattern)

    def deliver(self, event: MeshEvent) -> None:
        node = self.door.node
        mark = self.marker
        nodes = {node.node_id}
        for peer, state in node.router.peers.items():
            link = node.links.get(peer)
            if link is not None and link.state == "up" and mark in state.interest.versions:
                nodes.add(peer)
        if chosen(nodes, event.source, event.sequence) != node.node_id or not self.members:
            self.door.counters["queue_group_elsewhere"] += 1
            return
        client, sid = self.members[self.turn % len(self.members)]
        self.turn += 1
        self.door.counters["queue_group_delivered"] += 1
        client.deliver_member(sid, event)


class QueueGroups:
    """The node's queue groups of NATS clients, by (group, pattern)."""

    def __init__(self, door: NatsDoor) -> None:
        self.door = door
        self.groups: dict[tuple[str, str], QueueGroup] = {}

    def join(self, client: NatsClient, sid: str, group: str, pattern: str) -> QueueGroup:
        key = (group, pattern)
        holder = self.groups.get(key)
        if holder is None:
            holder = self.groups[key] = QueueGroup(self.door, group, pattern)
            self.door.node.subscribe(holder, pattern)
            self.door.node.subscribe(holder, holder.marker)
        holder.members.append((client, sid))
        return holder

    def leave(self, client: NatsClient, sid: str, holder: QueueGroup) -> None:
        holder.members = [(c, s) for c, s in holder.members if not (c is client and s == sid)]
        if not holder.members and self.groups.get((holder.group, holder.pattern)) is holder:
            del self.groups[(holder.group, holder.pattern)]
            self.door.node.unsubscribe(holder, holder.marker)
            self.door.node.unsubscribe(holder, holder.pattern)

    def status(self) -> list[dict[str, object]]:
        return [
            {"group": g, "pattern": p, "members": len(h.members)}
            for (g, p), h in list(self.groups.items())[:1000]
        ]
