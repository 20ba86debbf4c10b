"""A node's VPN imports: interest in the exporter's space for the importer's subscriptions, and the
exporter's events renamed into the importer's space at delivery (:mod:`meshplane.core.mesh.imports`);
requests of its clients to an imported service sent into the exporter's space, and their replies
back (:mod:`meshplane.core.mesh.replies`)."""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshplane.core.doors.nats_protocol import wrap
from meshplane.core.mesh.frames import FLAG_NATS_ENVELOPE
from meshplane.core.mesh.imports import Import, ImportInterest
from meshplane.core.mesh.replies import Replies
from meshplane.core.mesh.vpn import outward, prefix_of, vpn_of
from meshplane.core.subjects import fits, is_reserved
from meshplane.mesh.gateways import GatewayHolder
from meshplane.mesh.holders import Holder, MeshEvent

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode
    from meshplane.mesh.vpns import Vpns


@dataclass(eq=False)
class ImportHolder:
    """One import of one importing holder: the exporter's events it receives go to ``target``
    renamed into the importer's space."""

    target: Holder
    exporter_prefix: str
    importer_prefix: str
    an_import: Import
    counted: Counter[tuple[str, Import, str]]  # the node's, by (importing VPN, import, what)
    key: tuple[str, Import, str]  # (its importing VPN, its import, "events")
    too_long: int = 0  # renamed past what a frame takes: not delivered

    def deliver(self, event: MeshEvent) -> None:
        subject = self.importer_prefix + self.an_import.renamed(outward(self.exporter_prefix, event.subject))
        if not fits(subject):  # longer than a frame takes: it would break its subscriber's connection
            self.too_long += 1
            return
        self.counted[self.key] += 1
        self.target.deliver(
            MeshEvent(
                event.source,
                subject,
                event.sequence,
                event.timestamp_ms,
                event.body,
                event.flags,
                imported=True,
            )
        )


@dataclass(eq=False)
class ReplyHolder:
    """This node's reply subjects in an exporter's space: a reply goes back to its requester."""

    imports: Imports

    def deliver(self, event: MeshEvent) -> None:
        found = self.imports.replies.close(event.subject.rsplit(".", 1)[-1], time.monotonic())
        if found is not None:
            vpn, reply = found
            flags = event.flags & FLAG_NATS_ENVELOPE  # a direct event in the requester's VPN, headers kept
            self.imports.node.publish(reply, event.body, flags, prefix=prefix_of(vpn))


class Imports:
    """Which import holders a node's subscriptions need; kept in step by :meth:`subscribed` and
    :meth:`unsubscribed` (the node calls them for every holder but gateways) and :meth:`configure`."""

    def __init__(self, node: MeshNode) -> None:
        self.node = node
        self.interest = ImportInterest()
        self._holders: dict[tuple[Holder, str, int], ImportHolder] = {}
        self._of: dict[Holder, set[str]] = {}  # every holder's patterns in a VPN that imports (for reloads)
        self.replies = Replies()
        self.space = "_R_." + secrets.token_hex(4)  # this node's reply subjects in exporters' spaces
        self._reply_holder = ReplyHolder(self)
        self._services: dict[str, tuple[Import, ...]] = {}  # by importing VPN
        # What crossed each import, by (importing VPN, import, what): "events" delivered here,
        # "requests" sent to the exporter's service, "no_responders" (requests nobody there could take)
        self.crossed: Counter[tuple[str, Import, str]] = Counter()

    @property
    def active(self) -> bool:
        return bool(self.interest.imports)

    def configure(self, vpns: Vpns) -> None:
        """Take ``vpns``' imports: what the live subscriptions need is added, what they no longer do is
        given up (a reload)."""
        imports = {name: vpn.imports for name, vpn in vpns.items() if vpn.imports}
        if imports == self.interest.imports:
            return
        # The direct path skips the check for services: a route it learnt may be a new service's.
        self.node.direct.forget()
        self._configure_services(imports)
        for holder, patterns in list(self._of.items()):
            for pattern in list(patterns):
                self.unsubscribed(holder, pattern)
        self.interest = ImportInterest(imports)
        for holder, pattern in self.node.router.holdings():
            if not isinstance(holder, GatewayHolder):
                self.subscribed(holder, pattern)

    def _configure_services(self, imports: dict[str, tuple[Import, ...]]) -> None:
        services = {name: tuple(i for i in its if i.service) for name, its in imports.items()}
        self._services = {name: its for name, its in services.items() if its}
        exporters = {prefix_of(i.vpn) for its in self._services.values() for i in its}
        for pattern in self.node.router.patterns_of(self._reply_holder) - {
            e + self.space + ".*" for e in exporters
        }:
            self.node.unsubscribe(self._reply_holder, pattern)
        for exporter in exporters:
            self.node.subscribe(self._reply_holder, exporter + self.space + ".*")

    @property
    def services(self) -> bool:
        return bool(self._services)

    def request(
        self, vpn: str, subject: str, reply: str, headers: bytes | None, payload: bytes, requester: Hashable
    ) -> int | None:
        """A request of ``requester``, a client of ``vpn``, on ``subject``: sent into the exporter's space
        if it is an imported service's (the copies made), else None. Its reply comes back on ``reply``."""
        for an_import in self._services.get(vpn, ()):
            target = an_import.request_to(subject)
            if target is None:
                continue
            if not fits(prefix_of(an_import.vpn) + target):  # no responder there has such a subject
                return 0
            token = self.replies.open(vpn, reply, time.monotonic(), requester) if reply else ""
            mapped = f"{self.space}.{token}" if reply else ""
            enveloped = bool(mapped) or headers is not None
            body = wrap(mapped, headers, payload) if enveloped else payload
            flags = FLAG_NATS_ENVELOPE if enveloped else 0
            copies = self.node.publish(target, body, flags, prefix=prefix_of(an_import.vpn))
            self.crossed[(vpn, an_import, "requests" if copies else "no_responders")] += 1
            return copies
        return None

    def subscribed(self, holder: Holder, pattern: str) -> None:
        vpn = vpn_of(pattern)
        if isinstance(holder, (ImportHolder, ReplyHolder)) or vpn not in self.interest.imports:
            return
        if is_reserved(pattern[len(prefix_of(vpn)) :]):
            return  # queues ($G.), retained messages ($mqtt.)
        self._of.setdefault(holder, set()).add(pattern)
        for number, wanted in self.interest.subscribed(holder, vpn, pattern):
            self.node.subscribe(self._holder(holder, vpn, number), wanted)

    def unsubscribed(self, holder: Holder, pattern: str) -> None:
        patterns = self._of.get(holder)
        if patterns is None or pattern not in patterns:
            return
        patterns.discard(pattern)
        if not patterns:
            del self._of[holder]
        vpn = vpn_of(pattern)
        for number, wanted in self.interest.unsubscribed(holder, vpn, pattern):
            key = (holder, vpn, number)
            import_holder = self._holders[key]
            self.node.unsubscribe(import_holder, wanted)
            if not self.node.router.patterns_of(import_holder):
                del self._holders[key]

    def _holder(self, holder: Holder, vpn: str, number: int) -> ImportHolder:
        key = (holder, vpn, number)
        found = self._holders.get(key)
        if found is None:
            an_import = self.interest.imports[vpn][number]
            exporter, counted = prefix_of(an_import.vpn), (vpn, an_import, "events")
            found = ImportHolder(holder, exporter, prefix_of(vpn), an_import, self.crossed, counted)
            self._holders[key] = found
        return found

    def status(self) -> dict[str, Any]:
        return {
            "holders": len(self._holders),
            "delivered": sum(n for (_, _, what), n in self.crossed.items() if what == "events"),
            "too_long": sum(holder.too_long for holder in self._holders.values()),
            "requests_open": len(self.replies),
            **self.replies.counters,
            "by_import": self.by_import(),
        }

    def by_import(self) -> list[dict[str, Any]]:
        """What crossed each import the node has (or had: a reload keeps the counts), by importing VPN."""
        rows: dict[tuple[str, Import], dict[str, Any]] = {}
        configured = [(vpn, i) for vpn, its in self.interest.imports.items() for i in its]
        for vpn, an_import in [*configured, *((vpn, i) for vpn, i, _ in self.crossed)]:
            rows.setdefault((vpn, an_import), import_row(vpn, an_import))
        for (vpn, an_import, what), count in self.crossed.items():
            rows[(vpn, an_import)][what] = count
        return [rows[key] for key in sorted(rows, key=lambda k: (k[0], k[1].vpn, k[1].local))]


def import_row(vpn: str, an_import: Import) -> dict[str, Any]:
    """An import as ``GET /mesh`` shows it: the importing VPN, the exporter, the space as the importer's
    clients name it, and what crossed it."""
    kind = "service" if an_import.service else "events"
    shown = {"vpn": vpn, "from": an_import.vpn, "space": an_import.local, "kind": kind}
    return shown | {"events": 0, "requests": 0, "no_responders": 0}
