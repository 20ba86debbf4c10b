"""Each Message VPN's, and each VPN user's, share of a node's spools for other nodes and clusters: a
guaranteed event published on this node past its VPN's ``max_spool_bytes``, or past its user's (its
publisher logged in as the user on this node), is refused (never acknowledged, so never lost), counted
and said; events arriving from another node's spool are counted, never refused.

A spool counts a user's events under ``VPN\\0USER`` (:func:`~meshplane.mesh.commit_batch.share_key`),
and a VPN's bytes are the sum of its keys'. A spool read again at start knows its events' VPNs, not
their users (an event does not carry its publisher's user): a user's share counts what it published
since the node started."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from meshplane.mesh.commit_batch import share_key

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode
    from meshplane.mesh.spool import Spool


class VpnSpoolRoom:
    def __init__(self, node: MeshNode, spool_sets: tuple[Mapping[str, Spool], ...]) -> None:
        self.node = node
        self.spool_sets = spool_sets  # the node's spools by peer, and by other cluster

    def spooled_bytes(self, vpn: str) -> int:
        """The bytes of ``vpn``'s guaranteed events this node's spools hold unconfirmed."""
        users = share_key(vpn, "")
        return sum(
            held
            for spools in self.spool_sets
            for spool in spools.values()
            for key, held in spool.shares.bytes.items()
            if key == vpn or key.startswith(users)
        )

    def user_bytes(self, vpn: str, user: str) -> int:
        """The bytes of the guaranteed events ``user`` of ``vpn`` published on this node (since it
        started) that its spools hold unconfirmed."""
        key = share_key(vpn, user)
        return sum(spool.shares.bytes[key] for spools in self.spool_sets for spool in spools.values())

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

    def _user_limit(self, vpn: str, user: str) -> int | None:
        found = self.node.config.vpns.get(vpn)
        member = found.users.get(user) if found is not None else None  # gone in a reload: no limit
        return member.max_spool_bytes if member is not None else None

    def user_room(self, vpn: str, user: str) -> int | None:
        limit = self._user_limit(vpn, user)
        return None if limit is None else limit - self.user_bytes(vpn, user)

    def refuse_user(self, vpn: str, user: str) -> str:
        self.node.logins.limits_refused[(vpn, "user_spool_bytes")] += 1
        held, limit = self.user_bytes(vpn, user), self._user_limit(vpn, user)
        return (
            f"user {user!r} of Message VPN {vpn!r}: its guaranteed events hold {held} bytes in this "
            f"node's spools for other nodes (its limit {limit}): not stored"
        )
