"""Queue groups on a node (the design: :mod:`meshplane.core.doors.nats_groups`): one holder per
(group, pattern), whatever number of this node's clients are members of it. The NATS door's queue
groups and the MQTT door's shared subscriptions (``$share/G/filter``) are each a :class:`QueueGroups`,
under their own marker, so that a node never hands one event to a member of each."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from meshplane.core.doors.nats_groups import MARK, chosen, marker
from meshplane.mesh.holders import MeshEvent

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode


class Member(Protocol):
    def deliver_member(self, key: str, event: MeshEvent) -> None:
        """An event its group chose this member (its subscription ``key``) for."""


@dataclass(eq=False)
class QueueGroup:
    node: MeshNode
    counters: Counter[str]
    group: str
    pattern: str
    mark: str = MARK
    members: list[tuple[Member, str]] = field(default_factory=list)  # (client, its subscription's key)
    turn: int = 0

    @property
    def marker(self) -> str:
        return marker(self.group, self.pattern, self.mark)

    def deliver(self, event: MeshEvent) -> None:
        node = self.node
        mark = self.marker
        nodes = {node.node_id}
        for peer, state in node.router.peers.items():
            link = node.links.get(peer)
            if link is not None and link.state == "up" and mark in state.interest.versions:
                nodes.add(peer)
        if chosen(nodes, event.source, event.sequence) != node.node_id or not self.members:
            self.counters["queue_group_elsewhere"] += 1
            return
        client, key = self.members[self.turn % len(self.members)]
        self.turn += 1
        self.counters["queue_group_delivered"] += 1
        client.deliver_member(key, event)


class QueueGroups:
    """A door's queue groups on this node, by (group, pattern)."""

    def __init__(self, node: MeshNode, counters: Counter[str], mark: str = MARK) -> None:
        self.node = node
        self.counters = counters
        self.mark = mark
        self.groups: dict[tuple[str, str], QueueGroup] = {}

    def join(self, client: Member, key: str, group: str, pattern: str) -> QueueGroup:
        holder = self.groups.get((group, pattern))
        if holder is None:
            holder = QueueGroup(self.node, self.counters, group, pattern, self.mark)
            self.groups[(group, pattern)] = holder
            self.node.subscribe(holder, pattern)
            self.node.subscribe(holder, holder.marker)
        holder.members.append((client, key))
        return holder

    def leave(self, client: Member, key: str, holder: QueueGroup) -> None:
        holder.members = [(c, k) for c, k in holder.members if not (c is client and k == key)]
        if not holder.members and self.groups.get((holder.group, holder.pattern)) is holder:
            del self.groups[(holder.group, holder.pattern)]
            self.node.unsubscribe(holder, holder.marker)
            self.node.unsubscribe(holder, holder.pattern)

    def status(self) -> list[dict[str, object]]:
        return [
            {"group": g, "pattern": p, "members": len(h.members)}
            for (g, p), h in list(self.groups.items())[:1000]
        ]
