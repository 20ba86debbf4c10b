"""Idempotency marks: an idempotent publish's key written into the log itself, so that the answer
to it can be rebuilt from the log after a crash that lost the answers file's last records (the
events were on disk, their answer was not: without the mark a retry would append them again).

A publish of ``total`` events lands in one or more partitions; the last event it appends to each
partition carries a mark naming the key, ``total``, and which of the batch's events that
partition's run holds (ranges of their indexes in the batch). A partition's run is one write, so
its events sit at consecutive offsets ending at the marked one. Pure: no files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshplane.core.streamlog import MarkedEvent, StoredEvent

Place = tuple[int, int]  # (partition, offset)


def runs_of(partitions: Sequence[int]) -> dict[int, list[int]]:
    """The batch indexes each partition takes, in order (``partitions[i]``: where event i goes)."""
    runs: dict[int, list[int]] = {}
    for index, partition in enumerate(partitions):
        runs.setdefault(partition, []).append(index)
    return runs


def marked(events: Sequence[StoredEvent], partitions: Sequence[int], key: str) -> list[StoredEvent]:
    """``events`` with the last of each partition's run carrying the publish's mark."""
    result = list(events)
    for indexes in runs_of(partitions).values():
        e = result[indexes[-1]]
        mark = encode_mark(key, len(events), indexes)
        result[indexes[-1]] = MarkedEvent(e.id, e.event_type, e.data, e.key, e.metadata, mark)
    return result


def encode_mark(key: str, total: int, indexes: Sequence[int]) -> str:
    """``"<total> <start>-<end>,... <key>"``: the ranges half-open, the key last (it may hold spaces)."""
    ranges: list[list[int]] = []
    for index in indexes:
        if ranges and ranges[-1][1] == index:
            ranges[-1][1] += 1
        else:
            ranges.append([index, index + 1])
    return f"{total} {','.join(f'{a}-{b}' for a, b in ranges)} {key}"


@dataclass(frozen=True)
class Mark:
    key: str
    total: int
    indexes: tuple[int, ...]


def decode_mark(text: str) -> Mark | None:
    """None for anything that is not a well-formed mark (never raises)."""
    try:
        total_text, ranges_text, key = text.split(" ", 2)
        total = int(total_text)
        indexes: list[int] = []
        for part in ranges_text.split(","):
            a, b = (int(x) for x in part.split("-"))
            if not (indexes[-1] if indexes else -1) < a < b <= total:
                return None
            indexes.extend(range(a, b))
    except ValueError:
        return None
    return Mark(key, total, tuple(indexes)) if key else None


def reassemble(marked: Iterable[tuple[int, int, Mark]]) -> dict[str, list[Place]]:
    """The answers rebuilt from marks found in the logs, ``(partition, offset of the marked event,
    mark)``: a key's places in batch order, for the keys whose every event was found (a batch that
    lost a partition's run is left out: it was never acknowledged)."""
    places: dict[str, dict[int, Place]] = {}
    totals: dict[str, int] = {}
    for partition, offset, mark in marked:
        if totals.setdefault(mark.key, mark.total) != mark.total:
            continue
        first = offset - len(mark.indexes) + 1
        for i, index in enumerate(mark.indexes):
            places.setdefault(mark.key, {})[index] = (partition, first + i)
    return {
        key: [found[i] for i in range(totals[key])]
        for key, found in places.items()
        if len(found) == totals[key] and all(offset >= 0 for _, offset in found.values())
    }
