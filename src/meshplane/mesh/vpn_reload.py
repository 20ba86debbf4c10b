"""A node's Message VPNs read again without a restart (``SIGHUP``, or ``POST /mesh/vpns/reload``), as
``nats-server --signal reload``.

The file is read and checked whole first: a file with a mistake changes nothing (the node keeps the
VPNs it has, and says every mistake with its line). Then the new VPNs apply to every new connection,
login, publish and subscription, and to the clients connected now where they narrow:

- a client of a VPN that is gone, of a VPN that now has users while it logged in as none, or logged in
  as a user who is gone or whose password hash changed, is told why (REFUSED) and closed (it may not
  prove who it is again: its reconnection logs in afresh);
- a logged-in user whose permissions changed keeps its connection under the new ones; each pattern it
  holds that they refuse is removed and said to it (REFUSED, "revoked: ..."); the NATS and MQTT doors'
  clients are cut for the same reasons, and a user of theirs whose permissions changed is cut too (it
  connects again under the new ones);
- everyone else keeps its connection and subscriptions untouched. Limits apply from then on: clients
  and subscriptions beyond a lowered limit stay, and newcomers are refused until they are below it.

A VPN's queues and spools are not touched (a queue of a removed VPN stays until it is deleted).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplane.core.mesh.frames import FrameType, encode_frame
from meshplane.mesh.holders import ClientSession
from meshplane.mesh.vpns import Problem, Vpns, check_vpns, key_lines

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

log = logging.getLogger(__name__)


class VpnReloads:
    """Reloads of one node's VPN file: each one's outcome, the last kept for ``GET /mesh``."""

    def __init__(self, node: MeshNode, path: Path | None) -> None:
        self.node = node
        self.path = path
        self.counts: Counter[str] = Counter()  # "reloaded", "failed"
        self.last: dict[str, Any] = {}
        self.applied: list[Callable[[Vpns], None]] = []  # told of each reload's VPNs (the streams limits)

    def status(self) -> dict[str, Any]:
        return {"file": str(self.path) if self.path else None, **self.counts, "last": self.last}

    def reload(self) -> dict[str, Any]:
        """Read the file again and apply it (see the module); what happened, also logged."""
        outcome = self._reload()
        self.counts["reloaded" if outcome["ok"] else "failed"] += 1
        self.last = {"at": time.time(), **outcome}
        if outcome["ok"]:
            log.info(
                "reloaded the Message VPNs of %s: %d client(s) closed, %d subscription(s) revoked",
                self.path, outcome["closed"], outcome["revoked"],
            )  # fmt: skip
        else:
            log.error("kept the Message VPNs as they were: %s", "; ".join(outcome["problems"]))
        return self.last

    def _reload(self) -> dict[str, Any]:
        if self.path is None:
            return {"ok": False, "problems": ["this node was started without --mesh-vpns FILE"]}
        try:
            text = self.path.read_text()
        except OSError as exc:
            return {"ok": False, "problems": [f"{self.path}: cannot read it ({exc.strerror or exc})"]}
        vpns, problems = check_vpns(text)
        old = self.node.config.vpns
        lines = key_lines(text)
        for name in sorted(set(vpns) & set(old)):
            if vpns[name].dmr != old[name].dmr:  # its interest crossed (or not) under the old one
                line = lines.get(("vpns", name, "dmr"), lines.get(("vpns", name), 1))
                problems.append(Problem(line, f"[vpns.{name}]", "dmr changes only when the node restarts"))
        if problems:
            return {"ok": False, "problems": [problem.render(self.path) for problem in problems]}
        self.node.config.vpns = vpns
        self.node.logins.configured()
        self.node.imports.configure(vpns)
        for apply in self.applied:
            apply(vpns)
        closed = revoked = 0
        for session in list(self.node.clients.sessions.values()):
            why = _why_closed(session, old, vpns)
            if why:
                _tell(self.node, session, "", why)
                session.conn.close()
                closed += 1
            elif session.user and not session.login_pending:
                revoked += self._narrow(session, old, vpns)
        for door in (self.node.nats, self.node.mqtt):  # their clients are cut where they would narrow
            if door is not None:
                closed += door.reloaded(lambda vpn, user: _why_cut_from_door(vpn, user, old, vpns))
        return {"ok": True, "vpns": sorted(vpns), "closed": closed, "revoked": revoked}

    def _narrow(self, session: ClientSession, old: Vpns, new: Vpns) -> int:
        user = new[session.vpn].users[session.user]
        if session.vpn in old and user == old[session.vpn].users.get(session.user):
            return 0
        node = self.node
        session.permissions = permissions = user.permissions()
        revoked = 0
        for pattern in list(node.router.patterns_of(session)):
            external = pattern[len(session.prefix) :]
            refused = permissions.why_not_subscribe(external)
            if refused:
                node.logins.subscribed(session, -1)
                node.unsubscribe(session, pattern)
                _tell(node, session, external, f"revoked: {refused}")
                revoked += 1
        return revoked


def _why_closed(session: ClientSession, old: Vpns, new: Vpns) -> str:
    """Why ``session`` may not stay under the ``new`` VPNs, or ""."""
    if session.vpn in new and session.login_pending:  # its LOGIN is checked against the new users
        return ""
    return _why_not_as(session.vpn, session.user, old, new)


def _why_not_as(vpn_name: str, user_name: str, old: Vpns, new: Vpns) -> str:
    """Why a client of ``vpn_name`` logged in as ``user_name`` ("": as none) may not stay, or ""."""
    vpn = new.get(vpn_name)
    if vpn is None:
        return f"Message VPN {vpn_name!r} was removed"
    if not vpn.users:
        return "" if not user_name else f"Message VPN {vpn_name!r} has no users any more: connect again"
    if not user_name:
        return f"Message VPN {vpn_name!r} has users now: log in"
    user = vpn.users.get(user_name)
    if user is None:
        return f"user {user_name!r} was removed"
    before = old[vpn_name].users.get(user_name) if vpn_name in old else None
    if before is None or user.password_hash != before.password_hash:
        return f"user {user_name!r}'s password changed: log in again"
    if user.certificate != before.certificate:
        return f"user {user_name!r}'s certificate changed: log in again"
    return ""


def _why_cut_from_door(vpn_name: str, user_name: str, old: Vpns, new: Vpns) -> str:
    """A NATS or MQTT client's (``user_name`` "": it proved no VPN user): as a mesh client's, and the
    doors do not narrow subscriptions, so a user whose permissions changed connects again under them."""
    why = _why_not_as(vpn_name, user_name, old, new)
    if why or not user_name or new[vpn_name].users[user_name] == old[vpn_name].users[user_name]:
        return why
    return f"user {user_name!r}'s permissions changed: connect again"


def _tell(node: MeshNode, session: ClientSession, subject: str, reason: str) -> None:
    if session.conn.is_open:
        session.conn.send(encode_frame(FrameType.REFUSED, node.node_id, subject, 0, reason.encode()))
