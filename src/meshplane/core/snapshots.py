"""Snapshot diffing: turn "what is there now" into Added / Removed events (for polling and resync)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Added:
    """A key appeared, or its value changed."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Removed:
    key: str


DiscoveryEvent = Added | Removed


def diff_snapshot(known: dict[str, bytes], snapshot: Mapping[str, bytes]) -> list[DiscoveryEvent]:
    """Events that take ``known`` to ``snapshot``; ``known`` is updated in place."""
    events: list[DiscoveryEvent] = []
    for key in [k for k in known if k not in snapshot]:
        del known[key]
        events.append(Removed(key))
    for key, value in snapshot.items():
        if known.get(key) != value:
            known[key] = value
            events.append(Added(key, value))
    return events
