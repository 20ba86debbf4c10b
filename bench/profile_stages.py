"""Where a mesh node's CPU goes, by stage of an event's trip through it: py-spy's raw (collapsed)
stacks from ``bench/mesh.py --profile DIR``, each sample put in the first stage its stack reaches.

    python bench/profile_stages.py DIR/mesh-*.txt --us-per-event 2.6

Samples waiting in epoll, or of a thread waiting for work, are left out (the node was idle); with
``--us-per-event`` (the servers' CPU per event the same run printed, for both nodes together) the
shares become microseconds per event.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# (stage, markers): a sample counts for the first stage one of whose markers is a function in its stack
STAGES = (
    ("session records (AES-GCM seal and open)", ("Sealer.seal", "Opener.feed")),
    ("socket writes (transport.write, send())", ("FrameConnection.flush", "_SelectorSocketTransport.write")),
    ("dedup", ("DedupCache.seen", "dedup_seen")),
    ("route lookup", ("Router.route",)),
    ("direct path in C (checksum, copy to write buffers)", ("route_events",)),
    ("frame reader (C loop, checksum, Frame objects)", ("FrameReader.feed",)),
    ("delivery to local holders", ("ClientSession.deliver", "PubSubHolder.deliver")),
    (
        "per-event Python: dispatch, checks, MeshEvent, routing and counting",
        (
            "MeshNode._on_frame",
            "Clients.on_frame",
            "Routes.on_frame",
            "MeshNode._route",
            "DirectPath._read",
            "FrameConnection._handle_backlog",
        ),
    ),
    ("socket reads (recv())", ("_read_ready",)),
    ("event loop, timers, heartbeats, other", ("",)),
)
IDLE = ("epoll_wait", "select_epoll_poll", "EpollSelector.select")
# a thread waiting for work (a thread pool's queue: the password checker, file writes); its leaf is
# often an unnamed libc address, so the frames just above it are looked at
WAITING = ("PyThread_acquire_lock_timed", "pthread_cond_wait", "pthread_cond_timedwait")


def function(frame: str) -> str:
    match = re.match(r"(.*) \((.*)\)$", frame)
    return match.group(1) if match else frame


def stages(paths: list[Path]) -> tuple[Counter[str], int]:
    """Samples per stage (idle ones left out) and the number of busy samples."""
    counts: Counter[str] = Counter()
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, number = line.rpartition(" ")
            names = [function(frame) for frame in stack.split(";")]
            if any(idle in names[-1] for idle in IDLE) or any(
                wait in name for wait in WAITING for name in names[-3:]
            ):
                continue
            for stage, markers in STAGES:
                if any(marker in name for marker in markers for name in names):
                    counts[stage] += int(number)
                    break
    return counts, sum(counts.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--us-per-event", type=float, help="the servers' CPU per event in the same run")
    args = parser.parse_args()
    counts, total = stages(args.files)
    for stage, _ in STAGES:
        share = counts[stage] / max(total, 1)
        us = f"  {share * args.us_per_event:5.2f} us" if args.us_per_event else ""
        print(f"{share * 100:5.1f}%{us}  {stage}")
    print(f"{total} busy samples")


if __name__ == "__main__":
    main()
