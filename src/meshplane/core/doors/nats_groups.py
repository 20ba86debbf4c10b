"""NATS queue groups (and MQTT shared subscriptions) across a mesh, sans I/O: one member of a group
gets each event, whatever node each member is on (as nats-server across a cluster).

A node whose NATS clients hold members of group ``G`` on pattern ``P`` holds ``P`` (so that events on
it come to the node, as for any subscriber) and announces ``$NQ.G.P`` (:func:`marker`) through the
mesh's interest protocol, so every node knows which nodes have members of ``(G, P)``. A node never
forwards what it received, so each node with members gets the event from its origin; each of them
computes the same choice from the event's id and the nodes it knows (:func:`chosen`), and only the
chosen one hands the event to one of its members (round robin). While a member's interest is still
travelling, two nodes may see different sets of nodes for a moment: an event may then reach no member
or two, as in a nats-server cluster while a subscription propagates.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Collection

MARK = "$NQ"
MQTT_MARK = "$MQ"
MAX_GROUP = 64
_GROUP = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_GROUP}}}")


class InvalidGroup(ValueError):
    """A queue group name the mesh cannot carry in one token."""


def check_group(name: str) -> str:
    if not _GROUP.fullmatch(name):
        raise InvalidGroup(
            f"queue group {name[:40]!r}: 1-{MAX_GROUP} characters of A-Z, a-z, 0-9, _ and - on this door"
        )
    return name


def marker(group: str, pattern: str, mark: str = MARK) -> str:
    """The reserved pattern that tells the mesh a node has members of ``group`` on ``pattern`` (``mark``:
    the door's namespace of groups, ``$NQ`` NATS queue groups, ``$MQ`` MQTT shared subscriptions)."""
    return f"{mark}.{group}.{pattern}"


def unmarked(subject: str) -> str:
    """The pattern inside a group's marker (``$NQ.G.P`` or ``$MQ.G.P``: ``P``, which carries its VPN's
    prefix); any other subject as it is."""
    if subject.startswith((MARK + ".", MQTT_MARK + ".")):
        group_end = subject.find(".", len(MARK) + 1)
        if group_end > 0:
            return subject[group_end + 1 :]
    return subject


def chosen(nodes: Collection[str], source: str, sequence: int) -> str:
    """The node whose member gets the event ``(source, sequence)``: the same on every node that knows
    the same ``nodes`` (spread evenly over them by the event's id)."""
    ordered = sorted(nodes)
    return ordered[zlib.crc32(f"{source}/{sequence}".encode()) % len(ordered)]
