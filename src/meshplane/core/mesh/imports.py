"""Sharing between Message VPNs: exports and imports (NATS accounts' stream exports and imports), sans I/O.

A VPN *exports* a space of its subjects (``events = "orders.>"``, to any VPN or only those named); another
*imports* part of it (``{ vpn = "A", events = "orders.eu.>", prefix = "a" }``): its clients then see
A's event on ``orders.eu.x`` as ``a.orders.eu.x``. Nothing else crosses: an import maps one way, from
the exporter's space into the importer's, and is not passed on (an imported event is delivered, never
published again in the importer's space, so imports do not chain and cannot loop).

Where it happens: at the importing node's delivery. A subscription of the importer's client to a
pattern that meets an import's space (``a.>`` meets ``a.orders.eu.>``) adds interest in the exporter's
space (``$vpn:A.orders.eu.>``, the intersection with the prefix taken off) for a holder that maps each
event it receives into the importer's space. Links keep carrying every subject under its own VPN's
prefix: the exporter's events reach importing nodes as any interest draws them, and only that node
renames them, for its own importing clients.

:func:`intersect` is exact (a pattern matching the subjects both match, or None); :class:`ImportInterest`
counts, per holder, which exporter patterns its subscriptions need.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from meshplane.core.mesh.permissions import covers
from meshplane.core.mesh.vpn import prefix_of
from meshplane.core.subjects import ONE, REST, fits, pattern_shape


def intersect(a: str, b: str) -> str | None:
    """The pattern matching exactly the subjects both ``a`` and ``b`` match; None if none does.
    (Without a leading reserved token: the patterns of clients.)"""
    fixed_a, tail_a = pattern_shape(a)
    fixed_b, tail_b = pattern_shape(b)
    if len(fixed_a) > len(fixed_b):
        (fixed_a, tail_a), (fixed_b, tail_b) = (fixed_b, tail_b), (fixed_a, tail_a)
    common = []
    for x, y in zip(fixed_a, fixed_b, strict=False):
        if x != y and ONE not in (x, y):
            return None
        common.append(y if x == ONE else x)
    if len(fixed_a) < len(fixed_b):
        # ``a`` ends early: only its tail can take ``b``'s further tokens ('>' needs one at least,
        # which they are), and ``b``'s tail then decides what follows.
        if not tail_a:
            return None
        fixed, tail = common + fixed_b[len(fixed_a) :], tail_b
    elif tail_a == tail_b:
        fixed, tail = common, tail_a
    elif "" in (tail_a, tail_b):
        # No tail: exactly these tokens. '#' takes zero more (agrees), '>' one more at least (does not).
        if REST in (tail_a, tail_b):
            return None
        fixed, tail = common, ""
    else:  # '#' and '>': one more at least
        fixed, tail = common, REST
    tokens = [*fixed, tail] if tail else fixed
    return ".".join(tokens) if tokens else None


@dataclass(frozen=True)
class Export:
    """A space of a VPN's subjects other VPNs may import (``to``: only these; empty: any): its events,
    or, with ``service``, requests to its responders (whose replies go back to the requester)."""

    subjects: str
    to: tuple[str, ...] = ()
    service: bool = False


@dataclass(frozen=True)
class Import:
    """``subjects`` of VPN ``vpn`` (a space it exports), seen in the importing VPN under ``prefix``
    (a subject, or "" for none): A's ``orders.eu`` is the importer's ``<prefix>.orders.eu``. Events
    come from there; with ``service``, the importer's requests go there."""

    vpn: str
    subjects: str
    prefix: str = ""
    service: bool = False

    @property
    def local(self) -> str:
        """The import's space as the importer's clients name it."""
        return f"{self.prefix}.{self.subjects}" if self.prefix else self.subjects

    def wanted(self, pattern: str) -> str | None:
        """The exporter's pattern (a client's, without VPN prefix) a subscription to ``pattern`` in
        the importer's space needs from this import; None when it meets none of it."""
        met = intersect(pattern, self.local)
        if met is None:
            return None
        if not self.prefix:
            return met
        rest = met.split(".")[self.prefix.count(".") + 1 :]  # its first tokens are the prefix's words
        return ".".join(rest) or None  # '#' may take the prefix alone: no exporter subject is that

    def renamed(self, subject: str) -> str:
        """An exporter's subject (a client's) as the importer's clients see it."""
        return f"{self.prefix}.{subject}" if self.prefix else subject

    def request_to(self, subject: str) -> str | None:
        """The exporter's subject a request on the importer's ``subject`` goes to (None: not this
        service's)."""
        if not self.service or not covers(self.local, subject):
            return None
        return subject[len(self.prefix) + 1 :] if self.prefix else subject


def exported(exports: tuple[Export, ...], importer: str, an_import: Import) -> bool:
    """Whether some export of a VPN (of the import's kind) covers ``an_import`` for VPN ``importer``."""
    return any(
        e.service == an_import.service
        and covers(e.subjects, an_import.subjects)
        and (not e.to or importer in e.to)
        for e in exports
    )


@dataclass
class ImportInterest:
    """Which exporter patterns each holder's subscriptions need, counted: a holder subscribed to
    ``a.>`` and ``a.*.eu`` needs ``$vpn:A.orders.>`` and ``$vpn:A.orders.eu``; each is wanted while
    a subscription needing it is held. Holders are opaque keys; patterns are internal (VPN-prefixed).

    ``imports`` maps a VPN to its imports; an import is named by (its VPN, its index there)."""

    imports: dict[str, tuple[Import, ...]] = field(default_factory=dict)
    _needs: dict[tuple[object, str], list[tuple[int, str]]] = field(default_factory=dict)
    _counts: Counter[tuple[object, str, int, str]] = field(default_factory=Counter)

    def subscribed(self, holder: object, vpn: str, pattern: str) -> list[tuple[int, str]]:
        """``holder`` (of ``vpn``) now holds internal ``pattern``: the (import, exporter pattern)
        pairs it newly needs."""
        imports = self.imports.get(vpn)
        if not imports or (holder, pattern) in self._needs:
            return []
        prefix = prefix_of(vpn)
        external = pattern[len(prefix) :]
        needs = []
        for number, an_import in enumerate(imports):
            if an_import.service:  # requests go there at publishing; nothing is drawn from there
                continue
            wanted = an_import.wanted(external)
            if wanted is not None and fits(prefix_of(an_import.vpn) + wanted):  # (else no subject is)
                needs.append((number, prefix_of(an_import.vpn) + wanted))
        if not needs:
            return []
        self._needs[(holder, pattern)] = needs
        fresh = []
        for number, wanted in needs:
            self._counts[(holder, vpn, number, wanted)] += 1
            if self._counts[(holder, vpn, number, wanted)] == 1:
                fresh.append((number, wanted))
        return fresh

    def unsubscribed(self, holder: object, vpn: str, pattern: str) -> list[tuple[int, str]]:
        """``holder`` gave ``pattern`` up: the (import, exporter pattern) pairs no longer needed."""
        needs = self._needs.pop((holder, pattern), [])
        gone = []
        for number, wanted in needs:
            key = (holder, vpn, number, wanted)
            self._counts[key] -= 1
            if self._counts[key] <= 0:
                del self._counts[key]
                gone.append((number, wanted))
        return gone
