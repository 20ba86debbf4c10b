"""Message VPNs (Solace's term; NATS's accounts): isolated subject spaces on one mesh, sans I/O.

A VPN is a name. Inside a node and on every link (the client's own connection included: the client
adds and removes the prefix, its node checks it), a subject of VPN ``A`` travels as the reserved
subject ``$vpn:A.<subject>``; the default VPN's subjects travel as they are, so a mesh that names no
VPN sends the bytes it always sent. Isolation then follows from one matching rule
(:class:`~meshplane.core.subjects.PatternIndex`): the leading ``$`` tokens of a subject are matched by
name only, never by a wildcard. A default-VPN pattern (``>``, ``orders.*``, a queue's ``$G.>``) never
reaches ``$vpn:A.orders``, and a VPN's pattern is always under its own prefix, so no pattern of one VPN
reaches another's subject: interest tables, Bloom filters, route caches, dedup windows and spools, all
keyed by subject, are per VPN without knowing it. A queue's guaranteed interest is ``$G.`` + the
internal pattern (``$G.$vpn:A.orders.>``), so a queue ``orders`` in VPN A and one in VPN B are two.

The prefix costs a VPN's clients one token and ``len(prefix)`` bytes of the subject limits.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from meshplane.core.subjects import RESERVED

DEFAULT = "default"
MARK = "$vpn:"
MAX_NAME = 32
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_-]{{0,{MAX_NAME - 1}}}")


def check_vpn(name: str) -> str:
    """``name`` if it can name a VPN (1-32 of ``A-Z a-z 0-9 _ -``, the first a letter or digit: it
    begins its queues' topic names); else ValueError."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"VPN name {name[:40]!r}: 1-{MAX_NAME} characters of A-Z, a-z, 0-9, _ and -, "
            "the first a letter or digit"
        )
    return name


def prefix_of(vpn: str) -> str:
    """What a VPN's subjects and patterns carry in front inside the mesh ("" for the default VPN)."""
    return "" if vpn == DEFAULT else f"{MARK}{vpn}."


def vpn_of(subject: str) -> str:
    """The VPN an internal subject or pattern belongs to."""
    if not subject.startswith(MARK):
        return DEFAULT
    return subject[len(MARK) : subject.find(".")] if "." in subject else subject[len(MARK) :]


def in_vpn(valid: Callable[[str], object], prefix: str, subject: str) -> bool:
    """Whether a VPN's client may send ``subject`` (or a pattern): its VPN's ``prefix``, then what a
    client may name (no reserved first token), and ``valid`` (a subject or pattern check) of the whole."""
    return (
        subject.startswith(prefix) and not subject.startswith(RESERVED, len(prefix)) and bool(valid(subject))
    )


def outward(prefix: str, subject: str) -> str:
    """An internal subject as its VPN's clients see it (``prefix`` is the VPN's)."""
    return subject[len(prefix) :] if prefix and subject.startswith(prefix) else subject


def bound_role(role: str, vpn: str) -> str:
    """The role a handshake's proofs and keys are bound to: a client of a VPN beyond the default proves
    ``client@VPN``, so a relay cannot move it to another VPN (the default's bytes are unchanged)."""
    return role if vpn in ("", DEFAULT) else f"{role}@{vpn}"


def queue_topic(vpn: str, name: str) -> str:
    """The streams topic a VPN's queue is stored in: its name, after ``VPN:`` beyond the default VPN
    (``:`` is refused in the default VPN's new queue names, so two VPNs' queues never share a topic;
    a token scoped to ``VPN:`` reads that VPN's queues)."""
    return name if vpn == DEFAULT else f"{vpn}:{name}"
