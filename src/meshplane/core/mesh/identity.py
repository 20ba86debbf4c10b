"""Who a mesh certificate says its holder is, sans I/O: a role and an identity in a SAN URI, compared
byte for byte (docs/security.md).

- a member (a node, a gateway, an HA mate): ``meshplane://node/<cluster>/<node-id>``;
- a client: ``meshplane://client/<name>``.

DNS and IP subject alternative names are for host name checks only. A certificate carrying no
``meshplane://`` URI is one of an earlier release: its DNS names and common name are compared with the
claimed id without case, as DNS names compare and as that release did (ids are ASCII, so nothing else
folds), and the match is ``LEGACY`` (accepted for one release, with a warning); such a certificate
carries no role, so only URIs keep a client's certificate from linking as a member.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

SCHEME = "meshplane://"
MEMBER_PREFIX = SCHEME + "node/"
CLIENT_PREFIX = SCHEME + "client/"


class Match(enum.Enum):
    EXACT = "exact"  # the URI names the role and the identity claimed
    LEGACY = "legacy"  # no meshplane URI; a DNS name or the common name is the id claimed
    CLIENT = "client"  # a client's certificate claiming a member's role
    MISMATCH = "mismatch"  # names someone else


def member_uri(cluster: str, node_id: str) -> str:
    return f"{MEMBER_PREFIX}{cluster}/{node_id}"


def client_uri(name: str) -> str:
    return f"{CLIENT_PREFIX}{name}"


def uris(peercert: Mapping[str, Any] | None) -> list[str]:
    """The ``meshplane://`` URIs of a verified certificate (``ssl``'s ``getpeercert()``)."""
    if not peercert:
        return []
    return [
        value
        for kind, value in peercert.get("subjectAltName", ())
        if kind == "URI" and value.startswith(SCHEME)
    ]


def legacy_names(peercert: Mapping[str, Any] | None) -> set[str]:
    """A certificate's ASCII DNS names and common name, lower-cased."""
    if not peercert:
        return set()
    names = {value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"}
    for rdn in peercert.get("subject", ()):
        names.update(value for key, value in rdn if key == "commonName")
    return {name.lower() for name in names if name.isascii()}


def _legacy(peercert: Mapping[str, Any] | None, claims: Iterable[str]) -> Match:
    names = legacy_names(peercert)
    return (
        Match.LEGACY
        if any(claim.isascii() and claim.lower() in names for claim in claims)
        else Match.MISMATCH
    )


def match_member(
    peercert: Mapping[str, Any] | None, cluster: str, node_id: str, legacy: Iterable[str] = ()
) -> Match:
    """Whether a certificate proves a member ``node_id`` of ``cluster``. ``legacy``: the names an
    earlier release's certificate carried for that claim (a route's node id, a gateway's cluster)."""
    found = uris(peercert)
    if not found:
        return _legacy(peercert, legacy)
    if member_uri(cluster, node_id) in found:
        return Match.EXACT
    if all(uri.startswith(CLIENT_PREFIX) for uri in found):
        return Match.CLIENT
    return Match.MISMATCH


def match_client(peercert: Mapping[str, Any] | None) -> Match:
    """Whether a certificate may open a client session: a client's, a member's, or an earlier
    release's (any name). Its name is not checked against anything: clients are not named in HELLO."""
    found = uris(peercert)
    if not found:
        return Match.LEGACY
    if any(uri.startswith((CLIENT_PREFIX, MEMBER_PREFIX)) for uri in found):
        return Match.EXACT
    return Match.MISMATCH


# A certificate's names as a Message VPN user's ``certificate`` writes one, by kind (ssl's SAN kinds).
NAME_KINDS = {"DNS": "DNS", "email": "email", "URI": "URI", "IP Address": "IP"}
CERTIFICATE_NAME_FORMS = ("CN", *NAME_KINDS.values())


def certificate_names(peercert: Mapping[str, Any] | None) -> set[str]:
    """The names a verified certificate gives its holder: ``CN=<its subject's common name>`` and each
    subject alternative name as ``DNS=``, ``email=``, ``URI=`` or ``IP=`` (compared byte for byte, as
    a VPN user's ``certificate`` names one, nats-server's ``verify_and_map``)."""
    if not peercert:
        return set()
    names = {
        f"{NAME_KINDS[kind]}={value}"
        for kind, value in peercert.get("subjectAltName", ())
        if kind in NAME_KINDS
    }
    for rdn in peercert.get("subject", ()):
        names.update(f"CN={value}" for key, value in rdn if key == "commonName")
    return names
