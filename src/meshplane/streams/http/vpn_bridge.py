"""A Message VPN's pub/sub service on a mesh node: its patterns and messages cross the mesh in its VPN.

The default VPN's service joins the node as it always did (``MeshNode.attach``). VPN ``A``'s announces
its patterns and publishes its messages under the VPN's internal prefix (``$vpn:A.``,
:mod:`meshplane.core.mesh.vpn`), and hears only events of that prefix, with the prefix taken off: its
listeners and VPN ``A``'s mesh clients see each other's messages, and no other VPN's.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from meshplane.core.mesh.frames import FLAG_JSON_MESSAGE
from meshplane.core.mesh.vpn import outward, prefix_of
from meshplane.mesh.holders import MeshEvent, PubSubHolder, as_pubsub_message
from meshplane.mesh.node import MeshNode
from meshplane.streams.service import StreamsService

_json = msgspec.json.Encoder()


@dataclass(eq=False)
class VpnPubSubHolder(PubSubHolder):
    prefix: str = ""

    def deliver(self, event: MeshEvent) -> None:
        subject = outward(self.prefix, event.subject)
        if event.flags & FLAG_JSON_MESSAGE:  # a pub/sub message of this VPN, as its origin framed it
            frame = event.body
        else:  # a mesh client's event: named as the VPN's clients name it
            frame = _json.encode({**as_pubsub_message(event), "topic": subject})
        self.delivered += self.pubsub.deliver(subject, frame)


@dataclass(eq=False)
class VpnPubSubBridge:
    """As the default VPN's :class:`~meshplane.mesh.holders.PubSubBridge`, under the VPN's prefix."""

    node: MeshNode
    holder: VpnPubSubHolder
    prefix: str
    guaranteed = True

    def interest(self, pattern: str, added: bool) -> None:
        if added:
            self.node.subscribe(self.holder, self.prefix + pattern)
        else:
            self.node.unsubscribe(self.holder, self.prefix + pattern)

    def published(self, topic: str, frame: bytes) -> None:
        self.node.publish(topic, frame, FLAG_JSON_MESSAGE, skip=self.holder, prefix=self.prefix)

    async def published_guaranteed(self, topic: str, frame: bytes) -> None:
        await self.node.publish_guaranteed(self.prefix + topic, frame, FLAG_JSON_MESSAGE, skip=self.holder)


def attach_vpn(mesh: MeshNode, engine: StreamsService, vpn: str) -> None:
    """Join a VPN's pub/sub service to the node, in its VPN (before the node starts)."""
    prefix = prefix_of(vpn)
    bridge = VpnPubSubBridge(mesh, VpnPubSubHolder(engine.pubsub, prefix=prefix), prefix=prefix)
    engine.pubsub.mesh = bridge
    for pattern in engine.pubsub.patterns:
        bridge.interest(pattern, True)
