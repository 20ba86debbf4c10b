"""Each Message VPN's share of a node's spools for other nodes and clusters: a guaranteed event
published on this node past its VPN's ``max_spool_bytes`` is refused (never acknowledged, so never
lost), counted and said; events arriving from another node's spool are counted, never refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode
    from meshplane.mesh.spool import Spool


class VpnSpoolRoom:
    def __init__(self, node: MeshNode, spool_sets: tuple[Mapping[str, Spool], ...]) -> None:
        self.node = node
        self.spool_sets = spool_sets  # the node's spools by peer, and by other cluster

    def spooled_bytes(self, vpn: str) -> int:
        """The bytes of ``vpn``'s guaranteed events this node's spools hold unconfirmed."""
        return sum(s.shares.bytes[vpn] for spools in self.spool_sets for s in spools.values())

    def room(self, vpn: str) -> int | None:
        found = self.node.config.vpns.get(vpn)
        limit = found.max_spool_bytes if found is not None else None
        return None if limit is None else limit - self.spooled_bytes(vpn)

    def refuse(self, vpn: str) -> str:
        self.node.logins.limits_refused[(vpn, "spool_bytes")] += 1
        limit = self.node.config.vpns[vpn].max_spool_bytes
        return (
            f"Message VPN {vpn!r}: its guaranteed events hold {self.spooled_bytes(vpn)} bytes in this "
            f"node's spools for other nodes (its limit {limit}): not stored"
        )
