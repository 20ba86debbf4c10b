"""Human tables for the client commands' answers at a terminal (`--json`, or a pipe, gives JSON). Pure."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

#: Longest data cell in an event table: past it, the cell is cut so a row stays one line.
DATA_WIDTH = 60


def plain(value: Any) -> str:
    """A cell for people: ``-`` for nothing, a policy ``{"type": "Time", "retention_secs": 60}`` as
    ``time retention_secs=60``, other structures as compact JSON (never a Python repr)."""
    if value is None:
        return "-"
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        rest = " ".join(f"{k}={plain(v)}" for k, v in value.items() if k != "type")
        return f"{value['type'].lower()} {rest}".strip()
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return str(value)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header], *([plain(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def topic_stats(answer: dict[str, Any]) -> str:
    retention = answer["retention_policy"]
    title = f"topic {answer['topic']}: {answer['num_partitions']} partitions, retention {plain(retention)}"
    rows = [
        (
            p["partition_id"],
            p["min_offset"],
            p["next_offset"],
            p["message_count"],
            p["total_bytes"],
            p["segments"],
        )
        for p in answer["partitions"]
    ]
    return title + "\n" + table(("PARTITION", "OLDEST", "NEXT", "EVENTS", "BYTES", "SEGMENTS"), rows)


def topic_readers(answer: dict[str, Any]) -> str:
    """One row per reader and partition: where it is and how far behind."""
    readers = answer["readers"]
    if not readers:
        return f"topic {answer['topic']}: no readers (a Spark query records itself after its first batch)"
    rows = [
        (r["reader"], p, offset, r["lag"].get(p), f"{r['updated_secs_ago']:.0f}s ago")
        for r in readers
        for p, offset in r["offsets"].items()
    ]
    title = f"topic {answer['topic']}: {plural(len(readers), 'reader')}"
    return title + "\n" + table(("READER", "PARTITION", "OFFSET", "LAG", "RECORDED"), rows)


def group_stats(answer: dict[str, Any]) -> str:
    title = (
        f"group {answer['group_id']} on {answer['topic']}: {answer['state']}, "
        f"generation {answer['generation']}, {answer['member_count']} member(s), {answer['strategy']}"
    )
    owner = {p: m for m, ps in answer["assignment"].items() for p in ps}
    rows = [
        (p, owner.get(p), answer["committed"].get(str(p)), answer.get("lag", {}).get(str(p)))
        for p in range(answer["partition_count"])
    ]
    return title + "\n" + table(("PARTITION", "MEMBER", "COMMITTED", "LAG"), rows)


def room_history(answer: dict[str, Any]) -> str:
    events = answer["events"]
    if not events:
        return f"room {answer['room']}: no events in this range (next offset {answer['next_offset']})"
    title = (
        f"room {answer['room']}: offsets {events[0]['offset']}-{events[-1]['offset']} of "
        f"{answer['oldest_offset']}-{answer['next_offset'] - 1} (next {answer['next_offset']})"
    )
    rows = [(e["offset"], utc_time(e["timestamp_ms"]), e["event"], data_cell(e["data"])) for e in events]
    return title + "\n" + table(("OFFSET", "TIME", "EVENT", "DATA"), rows)


def utc_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def data_cell(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= DATA_WIDTH else text[: DATA_WIDTH - 1] + "…"


def membership(answer: dict[str, Any]) -> str:
    """A join, assignment or heartbeat answer: who, which generation, which partitions."""
    group = f" of group {answer['group_id']}" if "group_id" in answer else ""
    partitions = ", ".join(map(str, answer["partitions"])) or None
    owned = f"partitions {partitions}" if partitions else "no partitions"
    return f"member {answer['member_id']}{group}, generation {answer['generation']}: {owned}"


def fields(answer: Mapping[str, Any]) -> str:
    """A flat answer (room stats) as one aligned ``name  value`` line per field."""
    width = max(map(len, answer), default=0)
    return "\n".join(f"{name.ljust(width)}  {plain(value)}" for name, value in answer.items())


def names(header: str) -> Callable[[Any], str]:
    return lambda answer: table((header,), [(name,) for name in answer])


def mesh_status(answer: dict[str, Any]) -> str:
    return render_status(answer)


def render_status(status: dict[str, Any]) -> str:
    """The node, its interest, and one line per link, for people."""
    interest, counters = status["interest"], status["counters"]
    title = (
        f"node {status['node']} (cluster {status['cluster']}) at {status['route_url']}: "
        f"{len(status['clients'])} clients, {interest['subscriptions_local']} local subscriptions "
        f"({interest['patterns_local']} patterns announced), {interest['subscriptions_remote']} remote; "
        f"{counters['messages_routed']} routed, {counters['messages_forwarded']} forwarded, "
        f"fan-out {counters['fanout_avg']}"
    )
    if not status["links"] and not status.get("gateways"):
        return title + "\nno links (start the node with --routes, or --gateway)"
    rows = [
        (
            link["peer"],
            link["state"],
            link["patterns_remote"],
            link["events_out"],
            link["events_in"],
            link["batches_out"],
            link["dropped_peer_down"],
            link["resyncs"],
            link["bloom_false_positives"],
        )
        for link in status["links"]
    ]
    rows += [  # external links (gateways), by the cluster at the other end
        (
            f"cluster {gateway['cluster']}",
            gateway["state"],
            gateway["patterns_remote"],
            gateway["events_out"],
            gateway["events_in"],
            gateway["batches_out"],
            gateway["dropped_peer_down"],
            gateway["resyncs"],
            None,
        )
        for gateway in status.get("gateways", [])
    ]
    header = (
        "PEER",
        "STATE",
        "INTEREST",
        "EVENTS OUT",
        "EVENTS IN",
        "BATCHES",
        "DROPPED(DOWN)",
        "RESYNCS",
        "BLOOM FP",
    )
    return title + "\n" + table(header, rows)


def mesh_queues(answer: dict[str, Any]) -> str:
    queues = table(
        ("QUEUE", "PATTERNS", "STORED", "DUPLICATES"),
        [
            (q["name"], " ".join(q["patterns"]), q["stored"], q["duplicates"])
            for q in answer.get("queues", [])
        ],
    )
    spools = table(
        ("SPOOL FOR", "PENDING", "BYTES", "CONFIRMED", "REFUSED"),
        [(s["peer"], s["pending"], s["bytes"], s["acked"], s["refused"]) for s in answer.get("spools", [])],
    )
    return queues + "\n\n" + spools


#: (command, action) -> how its answer reads at a terminal.
RENDERERS: dict[tuple[str, str], Callable[[Any], str]] = {
    ("mesh", "status"): mesh_status,
    ("mesh", "queues"): mesh_queues,
    ("topic", "stats"): topic_stats,
    ("topic", "readers"): topic_readers,
    ("topic", "list"): names("TOPIC"),
    ("group", "stats"): group_stats,
    ("stream", "list"): names("ROOM"),
    ("stream", "history"): room_history,
    ("stream", "stats"): fields,
    ("group", "join"): membership,
    ("group", "assignment"): membership,
    ("group", "heartbeat"): membership,
}
