"""Human tables for the client commands' answers at a terminal (`--json`, or a pipe, gives JSON). Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header], *([("-" if c is None else str(c)) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def topic_stats(answer: dict[str, Any]) -> str:
    retention = answer["retention_policy"]
    title = f"topic {answer['topic']}: {answer['num_partitions']} partitions, retention {retention}"
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


def names(header: str) -> Callable[[Any], str]:
    return lambda answer: table((header,), [(name,) for name in answer])


def mesh_status(answer: dict[str, Any]) -> str:
    from meshplane.cli.mesh import render_status

    return render_status(answer)


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
    ("topic", "list"): names("TOPIC"),
    ("group", "stats"): group_stats,
    ("stream", "list"): names("ROOM"),
}
