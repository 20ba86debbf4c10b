"""Offsets of the Spark source: parsing, normalising and admission control. Pure: no Spark, no I/O.

An offset is ``{topic: {partition: next offset to read}}`` with partitions as strings. Spark compares
offsets as JSON text, so every offset this module returns has its keys sorted at both levels.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Mapping

from meshplane.errors import MeshplaneError

TopicOffsets = dict[str, dict[str, int]]
Bounds = Mapping[str, Mapping[str, tuple[int, int]]]  # topic -> partition -> (log start, log end)

EARLIEST = -2
LATEST = -1


class OffsetsError(MeshplaneError, ValueError):
    """A startingOffsets / endingOffsets option that cannot be used."""

    kind = "bad_request"


def normalize(offsets: Mapping[str, Mapping[str, int]]) -> TopicOffsets:
    """Sorted keys at both levels, int values: equal offsets serialise to equal JSON."""
    return {t: {p: int(offsets[t][p]) for p in sorted(offsets[t])} for t in sorted(offsets)}


def resolve(option: str | None, bounds: Bounds, default: str, name: str = "offsets") -> TopicOffsets:
    """``earliest`` | ``latest`` | JSON ``{"topic": {"0": 12, "1": -2}}`` (-2 earliest, -1 latest).

    A JSON option names every partition of every topic read, as Kafka insists: a partition left out
    would otherwise be read from a silent default. ``name`` is the option, for the messages.
    """
    text = (option or default).strip()
    if text in ("earliest", "latest"):
        side = 0 if text == "earliest" else 1
        return normalize({t: {p: b[side] for p, b in parts.items()} for t, parts in bounds.items()})
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise OffsetsError(
            f'{name} must be earliest, latest or JSON like {{"topic": {{"0": 5}}}}: {exc}'
        ) from None
    if not isinstance(raw, dict):
        raise OffsetsError(f"{name} JSON must be an object of topics")
    unknown = sorted(set(raw) - set(bounds))
    if unknown:
        raise OffsetsError(f"{name} name topics that are not read: {', '.join(unknown)}")
    result: dict[str, dict[str, int]] = {}
    for topic, parts in bounds.items():
        given = raw.get(topic, {})
        if not isinstance(given, dict):
            raise OffsetsError(f"{name} of topic {topic!r} must be an object of partitions")
        for p in given:
            if p not in parts:
                raise OffsetsError(
                    f"topic {topic!r} has no partition {p!r} (it has {', '.join(sorted(parts, key=int))})"
                )
        left_out = [f"{topic}/{p}" for p in sorted(parts, key=int) if p not in given]
        if left_out:
            raise OffsetsError(
                f"{name} must give every partition read (as Kafka's do; -2 earliest, -1 latest); it leaves "
                f"out {', '.join(left_out)}"
            )
        result[topic] = {}
        for p, (start, end) in parts.items():
            value = given[p]
            if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
                raise OffsetsError(f"{name}: {topic}/{p} must be an integer >= -2, not {value!r}")
            result[topic][p] = start if value == EARLIEST else end if value == LATEST else value
    return normalize(result)


def markers(option: str | None, marker: int) -> list[str]:
    """``topic/partition`` of every partition a JSON offsets option sets to ``marker`` (-1 or -2)."""
    try:
        raw = json.loads(option or "")
    except ValueError:
        return []
    if not isinstance(raw, dict):
        return []
    return [
        f"{topic}/{p}"
        for topic, parts in raw.items()
        if isinstance(parts, dict)
        for p, value in parts.items()
        if value == marker and not isinstance(value, bool)
    ]


def check_order(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> None:
    """Fail when a batch read's end lies before its start (Kafka fails the read; nothing is silent)."""
    behind = [
        f"{topic}/{p} ends at {o}, before its start {start[topic][p]}"
        for topic, parts in end.items()
        for p, o in parts.items()
        if o < start.get(topic, {}).get(p, o)
    ]
    if behind:
        raise OffsetsError(f"endingOffsets lie before startingOffsets: {', '.join(behind)}")


def check_written(offsets: Mapping[str, Mapping[str, int]], bounds: Bounds, option: str) -> None:
    """Fail when ``offsets`` (the end of a batch read) lie past what is written: those events do not
    exist yet, and a backfill does not wait for them."""
    ahead = [
        f"{topic}/{p} at {o} (it ends at {bounds[topic][p][1]})"
        for topic, parts in offsets.items()
        for p, o in parts.items()
        if o > bounds[topic][p][1]
    ]
    if ahead:
        raise OffsetsError(
            f"{option} lie past the written events: {', '.join(ahead)}; use offsets up to the end, or -1 "
            "(latest)"
        )


def past_end(offsets: Mapping[str, Mapping[str, int]], bounds: Bounds) -> list[tuple[str, str, int, int]]:
    """(topic, partition, offset, end) of every partition ``offsets`` places past its end."""
    return [
        (topic, p, o, bounds[topic][p][1])
        for topic, parts in offsets.items()
        for p, o in parts.items()
        if p in bounds.get(topic, {}) and o > bounds[topic][p][1]
    ]


def fill_new_partitions(start: Mapping[str, Mapping[str, int]], bounds: Bounds) -> TopicOffsets:
    """``start`` plus partitions (and topics) that appeared since, from their earliest offset."""
    filled = {t: dict(parts) for t, parts in start.items()}
    for topic, parts in bounds.items():
        for p, (log_start, _) in parts.items():
            filled.setdefault(topic, {}).setdefault(p, log_start)
    return normalize(filled)


def cap(
    latest: Mapping[str, Mapping[str, int]], target: Mapping[str, Mapping[str, int]] | None
) -> TopicOffsets:
    """``latest`` no further than ``target`` (Trigger.AvailableNow's end); unknown partitions stay."""
    if target is None:
        return normalize(latest)
    return normalize(
        {t: {p: min(o, target.get(t, {}).get(p, o)) for p, o in parts.items()} for t, parts in latest.items()}
    )


def admit(
    start: Mapping[str, Mapping[str, int]], latest: Mapping[str, Mapping[str, int]], max_events: int | None
) -> TopicOffsets:
    """The end offset of the next micro-batch: at most ``max_events`` events in all.

    The budget is shared in proportion to each partition's backlog (as Spark's Kafka source does);
    what rounding leaves goes one event at a time to partitions in sorted order. Deterministic.
    """
    starts = {(t, p): start.get(t, {}).get(p, o) for t, parts in latest.items() for p, o in parts.items()}
    backlog = {k: max(0, latest[k[0]][k[1]] - s) for k, s in starts.items()}
    total = sum(backlog.values())
    if max_events is None or total <= max_events:
        # Never behind the start (a log that was reset must not move a query backwards).
        return normalize(
            {t: {p: max(o, starts[(t, p)]) for p, o in parts.items()} for t, parts in latest.items()}
        )
    share = {k: backlog[k] * max_events // total for k in sorted(backlog)}
    left = max_events - sum(share.values())
    for k in sorted(backlog):
        if left == 0:
            break
        if share[k] < backlog[k]:
            share[k] += 1
            left -= 1
    end: dict[str, dict[str, int]] = {}
    for (t, p), s in starts.items():
        end.setdefault(t, {})[p] = s + share[(t, p)]
    return normalize(end)


def ranges(
    start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]
) -> list[tuple[str, int, int, int]]:
    """(topic, partition, from, until) for every partition with events between start and end."""
    out = []
    for topic in sorted(end):
        for p in sorted(end[topic], key=int):
            first = start.get(topic, {}).get(p, end[topic][p])
            if end[topic][p] > first:
                out.append((topic, int(p), first, end[topic][p]))
    return out


def skip_deleted(start: Mapping[str, Mapping[str, int]], bounds: Bounds) -> TopicOffsets:
    """``start`` moved up to each partition's oldest retained offset (what ``failOnDataLoss=false``
    skips, in one step)."""
    return normalize(
        {
            t: {p: max(o, bounds.get(t, {}).get(p, (o, o))[0]) for p, o in parts.items()}
            for t, parts in start.items()
        }
    )


def backlog(start: Mapping[str, Mapping[str, int]], latest: Mapping[str, Mapping[str, int]]) -> int:
    """Events between ``start`` and ``latest``, over all partitions."""
    return sum(
        max(0, o - start.get(t, {}).get(p, o)) for t, parts in latest.items() for p, o in parts.items()
    )


Range = tuple[str, int, int, int]  # topic, partition, from, until


def split(ranges: list[Range], min_partitions: int) -> list[Range]:
    """At least ``min_partitions`` ranges where there are that many events: the largest range is
    halved until there are enough (deterministic; order: topic, partition, offset)."""
    heap = [(-(until - first), topic, p, first, until) for topic, p, first, until in ranges]
    heapq.heapify(heap)
    while len(heap) < min_partitions and heap and -heap[0][0] > 1:
        _, topic, p, first, until = heapq.heappop(heap)
        middle = first + (until - first) // 2
        heapq.heappush(heap, (-(middle - first), topic, p, first, middle))
        heapq.heappush(heap, (-(until - middle), topic, p, middle, until))
    return sorted((topic, p, first, until) for _, topic, p, first, until in heap)
