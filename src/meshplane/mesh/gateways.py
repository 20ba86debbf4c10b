"""Gateways: a cluster's node with external links to the gateways of other clusters (seed 002).

- Over an external link a gateway advertises its whole cluster's interest, aggregated: its own
  clients' patterns and every internal peer's, each pattern once (:attr:`Gateways.interest`, its own
  version counter and Merkle digest, as for links). It never advertises what it learnt from another
  cluster, so interest crosses one external link and stops: with A-B, A-C and B-D links, D never
  learns A's subscriptions.
- Inside its cluster the gateway holds each remote cluster's interest as a local holder (a
  :class:`GatewayHolder`), so the other nodes send it what those clusters want, and an event of its
  own cluster for another cluster leaves through the holder: one copy per external link.
- An event that came over an external link goes to this cluster only (local holders and internal
  peers with interest), never out on another external link.
- A Message VPN with ``dmr = false`` stays in its cluster (Solace's per-VPN DMR switch): none of its
  interest (its retained messages' ``$mqtt.`` too) is advertised to other clusters nor taken from them,
  and its events and guaranteed events arriving from one are dropped and counted (``outside_dmr``);
  routes inside the cluster carry it.
- Queues' interest (``$G.``) crosses too, aggregated from every node's queues as the gateway knows
  them (kept on disk, so it does not flap when an internal link restarts); guaranteed events then
  cross as SPOOLED frames from a spool per other cluster (:mod:`.guaranteed`).

One gateway per cluster: every external link of a cluster ends on the same node. The dialling side
of a pair is the cluster whose name sorts first, so two clusters share at most one external link.
If the gateway dies its cluster is cut off from the others until it returns.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from meshplane.core.doors.mqtt_topics import RETAIN_PREFIX
from meshplane.core.doors.nats_groups import unmarked
from meshplane.core.mesh.frames import (
    FLAG_GUARANTEED,
    Frame,
    FrameType,
    Hello,
    encode_frame,
    event_parts,
)
from meshplane.core.mesh.interest import (
    OwnInterest,
    PeerInterest,
    encode_leaves,
)
from meshplane.core.mesh.interest_frames import (
    Known,
    Refusal,
    interest_batch,
    interest_change,
    sync_answer,
    sync_reply,
)
from meshplane.core.mesh.vpn import vpn_of
from meshplane.mesh.connection import close_peer
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.links import Handshake, Link, announce, link_status, peer_address
from meshplane.mesh.queues import PREFIX

if TYPE_CHECKING:
    from meshplane.mesh.guaranteed import Guaranteed
    from meshplane.mesh.node import MeshNode


@dataclass(eq=False)
class GatewayHolder:
    """Another cluster as a holder in this node's routing table: delivering is sending over the link."""

    link: GatewayLink
    guaranteed: Guaranteed | None = None

    def deliver(self, event: MeshEvent) -> None:
        link = self.link
        spooling = self.guaranteed if event.flags & FLAG_GUARANTEED else None
        if spooling is not None and spooling.cluster_wants(link.peer, event.subject):
            return  # that cluster's spool carries it, and serves its direct subscribers too
        if link.state != "up" or link.conn is None:
            link.counters["dropped_peer_down"] += 1
            return
        link.conn.send(event.raw)
        link.events_out += 1


@dataclass(eq=False)
class GatewayLink(Link):
    """An external link: ``peer`` is the other cluster's name; ``interest`` what it advertised."""

    external: ClassVar[bool] = True
    interest: PeerInterest = field(default_factory=PeerInterest)
    holder: GatewayHolder = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.holder = GatewayHolder(self)


class Gateways:
    def __init__(self, node: MeshNode) -> None:
        self.node = node
        self.remote = dict(node.config.gateways)  # cluster -> its gateway's address
        self.links: dict[str, GatewayLink] = {}
        self.interest = OwnInterest()  # this cluster's, as other clusters are told

    @property
    def enabled(self) -> bool:
        return bool(self.remote)

    def dials(self) -> list[str]:
        """The addresses this gateway dials: those of clusters whose names sort after its own."""
        own = self.node.config.cluster
        return [  # a gateway with an HA mate is named by both addresses, dialled in turn
            url.strip()
            for cluster, urls in sorted(self.remote.items())
            if own < cluster
            for url in urls.split(",")
        ]

    # --- interest this cluster advertises ------------------------------------------------------------

    def link(self, cluster: str) -> GatewayLink:
        link = self.links.get(cluster)
        if link is None:
            link = self.links[cluster] = GatewayLink(cluster)
            link.holder.guaranteed = self.node.guaranteed
        return link

    def holder(self, cluster: str) -> GatewayHolder:
        return self.link(cluster).holder

    def changed(self, added: Iterable[str], removed: Iterable[str]) -> None:
        """Patterns gained or lost by a holder here (not a gateway) or by an internal peer. Queues'
        (``$G.``) cross through :meth:`queues_changed`."""
        if not self.enabled:
            return
        for pattern in added:  # a VPN's ($vpn:...) cross: that VPN's interest in the other clusters
            if not self.crosses(pattern):
                continue
            version = None if pattern.startswith(PREFIX) else self.interest.add(pattern)
            if version is not None:
                self._announce(FrameType.SUB_ADD, pattern, version)
        for pattern in removed:
            version = None if pattern.startswith(PREFIX) else self.interest.remove(pattern)
            if version is not None:
                self._announce(FrameType.SUB_REMOVE, pattern, version)

    def queues_changed(self, added: Iterable[str], removed: Iterable[str]) -> None:
        """Queue patterns (without ``$G.``) gained or lost by a queue of this node or of an internal
        peer, as this node remembers them."""
        if not self.enabled:
            return
        for pattern in added:
            if not self.crosses(pattern):
                continue
            version = self.interest.add(PREFIX + pattern)
            if version is not None:
                self._announce(FrameType.SUB_ADD, PREFIX + pattern, version)
        for pattern in removed:
            version = self.interest.remove(PREFIX + pattern)
            if version is not None:
                self._announce(FrameType.SUB_REMOVE, PREFIX + pattern, version)

    def crosses(self, subject: str) -> bool:
        """Whether a subject or pattern (without ``$G.``) belongs to a VPN that crosses gateways (a
        retained message's ``$mqtt.`` subject: its topic's VPN; a queue group's marker: its pattern's)."""
        vpn = self.node.config.vpns.get(vpn_of(unmarked(subject.removeprefix(RETAIN_PREFIX))))
        return vpn is None or vpn.dmr

    def _announce(self, kind: FrameType, pattern: str, version: int) -> None:
        announce(self.links.values(), self.node.node_id, kind is FrameType.SUB_ADD, pattern, version)

    # --- links ---------------------------------------------------------------------------------------

    def install(self, state: Handshake, hello: Hello) -> None:
        """An external link whose handshake is complete (its cluster checked, both proofs right)."""
        node, cluster = self.node, hello.cluster
        link = self.link(cluster)
        if link.conn is not None and link.conn is not state.conn:
            # One external link between two clusters: a live one is replaced only by its own process
            # as the link starts (``Handshakes._link_taken`` refused anything else).
            link.conn.close()
        state.role, state.peer, state.conn.peer = "gateway", cluster, cluster
        transport = state.conn.transport
        link.address = peer_address(transport)
        link.conn, link.state, link.last_heard, link.epoch = (
            state.conn,
            "syncing",
            time.monotonic(),
            hello.epoch,
        )
        link.since = link.last_heard
        link.interest_batches = hello.interest_batches and "no_interest_batches" not in node.config.faults
        link.counters["connects"] += 1
        link.down.clear()
        node.direct.link_reader(link, state.conn, foreign=True)
        # Learnt afresh, as on an internal link, but its queues stay remembered until it answers.
        forgotten = [(False, p) for p in link.interest.clear() if not p.startswith(PREFIX)]
        node.change_holdings(link.holder, forgotten)
        node.guaranteed.link_down(link)  # a new connection resends what was not confirmed
        self._request_sync(link)

    def _request_sync(self, link: GatewayLink) -> None:
        if link.conn is not None:
            link.sync_sent = time.monotonic()
            payload = encode_leaves(link.interest.leaves())
            link.conn.send(encode_frame(FrameType.SYNC_REQ, self.node.node_id, payload=payload))

    def on_close(self, cluster: str, conn: Any) -> None:
        link = self.links.get(cluster)
        if link is not None and link.conn is conn:
            link.conn, link.state, link.sync_sent = None, "down", None
            link.down.set()
            self.node.guaranteed.link_down(link)

    def on_frame(self, cluster: str, frame: Frame) -> None:
        node, link = self.node, self.links[cluster]
        link.last_heard = time.monotonic()
        kind = frame.type
        if kind is FrameType.EVENT:
            self._on_event(link, frame)
        elif kind is FrameType.SPOOLED:
            node.guaranteed.on_spooled(link, frame)
        elif kind is FrameType.ACK:
            node.guaranteed.on_ack(link, frame)
        elif kind in (FrameType.SUB_ADD, FrameType.SUB_REMOVE):
            added = kind is FrameType.SUB_ADD
            link.counters["sub_add_in" if added else "sub_remove_in"] += 1
            pattern = interest_change(frame, self._known(link), time.time_ns())
            if isinstance(pattern, Refusal):
                self._refuse(link, pattern)
            elif link.interest.apply(pattern, frame.sequence, added):
                self._learnt(link, {pattern} if added else (), () if added else {pattern})
        elif kind is FrameType.INTEREST:
            self._on_interest(link, frame)
        elif kind is FrameType.HEARTBEAT:
            if link.state == "up" and link.sync_sent is None and frame.payload != link.interest.root():
                link.counters["resyncs"] += 1
                self._request_sync(link)
        elif kind is FrameType.SYNC_REQ and link.conn is not None:
            reply = sync_reply(frame, node.node_id, self.interest)
            if isinstance(reply, Refusal):
                return self._refuse(link, reply)
            link.conn.send(reply)
        elif kind is FrameType.SYNC_RESP and frame.payload:
            answer = sync_answer(frame.payload, self._known(link), time.time_ns())
            if isinstance(answer, Refusal):
                return self._refuse(link, answer)
            gained, lost = link.interest.replace(answer.version, answer.buckets)
            link.sync_sent = None
            if link.state == "syncing":
                link.state = "up"
                self._learnt(link, gained, lost, afresh=True)
            else:
                self._learnt(link, gained, lost)

    def _on_interest(self, link: GatewayLink, frame: Frame) -> None:
        """Many SUB_ADD / SUB_REMOVE in one frame: checked as a route's are, applied in one go."""
        link.counters["interest_frames_in"] += 1
        checked = interest_batch(frame.payload, self._known(link), link.interest.versions, time.time_ns())
        if isinstance(checked, Refusal):
            return self._refuse(link, checked)
        added = sum(change.added for change in checked.changes)
        link.counters["sub_add_in"] += added
        link.counters["sub_remove_in"] += len(checked.changes) - added
        link.counters["bad_frames"] += checked.bad
        gained, lost = link.interest.apply_many(checked.changes)
        if gained or lost:
            self._learnt(link, gained, lost)

    def _learnt(
        self, link: GatewayLink, gained: Iterable[str], lost: Iterable[str], afresh: bool = False
    ) -> None:
        """Another cluster's interest changed: direct patterns go into the routing table at once,
        queues' through :class:`Guaranteed` (remembered on disk). ``afresh``: the link's first answer,
        which holds the cluster's whole interest."""
        node, holder = self.node, link.holder
        gained = [p for p in gained if self.crosses(p.removeprefix(PREFIX))]
        lost = [p for p in lost if self.crosses(p.removeprefix(PREFIX))]
        changes = [(True, p) for p in gained if not p.startswith(PREFIX)]
        node.change_holdings(holder, changes + [(False, p) for p in lost if not p.startswith(PREFIX)])
        if afresh:
            node.guaranteed.link_up(
                link, [p for p in link.interest.versions if self.crosses(p.removeprefix(PREFIX))]
            )
            if node.mqtt is not None:
                node.mqtt.link_up(link)
        else:
            node.guaranteed.cluster_learnt(link.peer, gained, lost)

    def _known(self, link: GatewayLink) -> Known:
        limit = self.node.config.limits.max_patterns_per_peer
        return Known(link.interest.version, len(link.interest.versions), link.epoch, limit)

    @staticmethod
    def _refuse(link: GatewayLink, refusal: Refusal) -> None:
        if refusal.close:
            close_peer(link.conn, refusal.reason)
        else:
            link.counters["bad_frames"] += 1

    def _on_event(self, link: GatewayLink, frame: Frame) -> None:
        node = self.node
        link.events_in += 1
        if not node.valid_subject(frame.subject):
            link.counters["bad_frames"] += 1
            return
        if not self.crosses(frame.subject):
            link.counters["outside_dmr"] += 1
            return
        timestamp, body = event_parts(frame)
        # Node ids are unique within a cluster only: the cluster is part of the id here.
        if node.dedup.seen(
            frame.subject, (timestamp, frame.sequence, frame.source, link.peer), time.monotonic()
        ):
            link.counters["duplicates_in"] += 1
            return
        event = MeshEvent(
            frame.source, frame.subject, frame.sequence, timestamp, body, frame.flags, frame.raw
        )
        if not node.route_foreign(event):
            link.counters["unwanted_in"] += 1
        if not frame.flags:
            node.direct.foreign(frame.subject)

    def tick(self, now: float) -> None:
        if not self.links:
            return
        heartbeat = encode_frame(
            FrameType.HEARTBEAT,
            self.node.node_id,
            sequence=self.interest.version,
            payload=self.interest.root(),
        )
        for link in self.links.values():
            if link.conn is None:
                continue
            if now - link.last_heard > self.node.config.dead_after:
                link.counters["dead_peer_timeouts"] += 1
                link.conn.close()
                continue
            link.conn.send(heartbeat)
            if link.sync_sent is not None and now - link.sync_sent > self.node.config.dead_after:
                self._request_sync(link)

    def status(self) -> list[dict[str, Any]]:
        spools = {
            s["peer"]: s for s in self.node.guaranteed.spool_status(self.node.guaranteed.cluster_spools)
        }
        return [
            {
                "cluster": cluster,
                **link_status(link, len(link.interest.versions), 0),
                "spool": spools.get(cluster),
            }
            for cluster, link in sorted(self.links.items())
        ]

    def patterns(self, limit: int) -> dict[str, list[str]]:
        return {cluster: sorted(link.interest.versions)[:limit] for cluster, link in self.links.items()}
