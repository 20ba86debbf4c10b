"""What start-up says about a damaged data directory: one summary (how many problems, where, the
first few, what was done, the command that lists them), not one line per damaged record."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("meshplane.streams")
SHOWN = 3  # problems quoted in the summary


class DataProblems:
    """What was found wrong in a data directory's metadata: each logged once, the last 100 kept."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.found: list[str] = []

    def report(self, problem: str) -> None:
        log.error("streams data %s: %s", self.root, problem)
        self.found.append(problem)
        del self.found[:-100]

    def set_aside(self, path: Path, problem: str) -> None:
        """Move an unreadable file out of the way (``<name>.corrupt-<time>``), and report it."""
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(f"{path.name}.corrupt-{time.time_ns()}"))
        self.report(problem + f"; the file was set aside as {path.name}.corrupt-*")


@contextlib.contextmanager
def counted_not_logged() -> Iterator[None]:
    """While the logs open, their recovery counts each problem instead of logging it (a log written by
    two servers at once has thousands)."""
    segments = logging.getLogger("meshplane.streams.segments")
    before = segments.level
    segments.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        segments.setLevel(before)


def local_logs(rooms: Iterable[Any], topics: Iterable[Any]) -> list[tuple[str, int, list[str]]]:
    """(name, problems found, the last of them) of every local log (JetStream keeps its own)."""
    logs = [(f"room {room.name}", room.problems_total, room.problems) for room in rooms]
    logs += [
        (f"topic {topic.name}/{n}", plog.problems_total, plog.problems)
        for topic in topics
        for n, plog in enumerate(topic.partitions)
    ]
    return logs


def summarise(root: Path, logs: Iterable[tuple[str, int, list[str]]]) -> str | None:
    """``logs``: (name, problems found, the last of them) per log. One line, or None when all is well."""
    damaged = [(name, total, last) for name, total, last in logs if total]
    if not damaged:
        return None
    total = sum(count for _, count, _ in damaged)
    first = "; ".join(f"{name}: {last[0]}" for name, _, last in damaged[:SHOWN] if last)
    return (
        f"streams data {root}: {total} problem(s) in {len(damaged)} log(s) found at start ({first}). "
        "Damaged records are skipped (readers see them as gaps), torn tails were set aside under each "
        f"log's quarantine/; `meshplane log verify --data-dir {root}` lists every one (stop the server "
        "first), GET /storage the latest"
    )
