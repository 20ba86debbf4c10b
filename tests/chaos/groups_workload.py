"""A consumer group under faults: one streams server (host a, its data on a lossy disk), a topic of
four partitions, three members on the client host. Each member joins (2 s sessions), heartbeats,
and for every partition it owns commits the next offset (the group's committed one plus one when it
takes a partition over), recording each assignment the server gave it and each commit's outcome.

Checked (:func:`check_group`): no partition with two owners in one generation; no commit accepted
from a member that did not own the partition in that generation (fencing); the accepted commits of a
partition strictly increasing (a lost commit shows as a later one going back); at the end, each
partition's committed offset is the last accepted one, or one an unknown commit set (then that commit
is checked as an accepted one is: owner, generation, order). Order and fencing compare a commit with those
answered before it was sent: one that overlapped it (a server paused between storing a commit and
answering it) may have been stored first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp

from meshplane.core.groups import IllegalGeneration, NotPartitionOwner, UnknownMember
from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import StreamError
from tests.chaos.checker import Verdict
from tests.chaos.harness import Servers, Workload, run_schedule, streams_server
from tests.chaos.schedule import Fault

TOPIC, GROUP, PARTITIONS = "work", "workers", 4
REFUSED = (IllegalGeneration, NotPartitionOwner, UnknownMember)  # definite: nothing was stored


@dataclass(frozen=True)
class Assigned:
    member: str
    generation: int
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class Commit:
    member: str
    generation: int
    partition: int
    offset: int
    outcome: str  # ok, refused, unknown
    sent: int | None = None  # how many commits had been answered when it was sent (None: all before it)


def check_group(
    assigned: Iterable[Assigned], commits: Iterable[Commit], final: dict[int, int | None]
) -> Verdict:
    """Pure. ``commits`` in the order they were answered; ``final``: each partition's committed offset
    read at the end. Split ownerships, commits accepted from a non-owner or from a generation already
    replaced count as ``unexpected``, an
    accepted commit not above the one before it as ``reordered``, a final offset below the last
    accepted one as ``lost``."""
    owners: dict[tuple[int, int], set[str]] = {}
    owned: set[tuple[str, int, int]] = set()
    for a in assigned:
        for p in a.partitions:
            owners.setdefault((a.generation, p), set()).add(a.member)
            owned.add((a.member, a.generation, p))
    done = list(commits)
    verdict = Verdict(
        operations=len(done),
        acknowledged=sum(c.outcome == "ok" for c in done),
        indeterminate=sum(c.outcome == "unknown" for c in done),
        unexpected=sum(len(members) - 1 for members in owners.values())
        + sum(c.outcome == "ok" and (c.member, c.generation, c.partition) not in owned for c in done),
    )
    # after[k]: per partition, the highest offset and the newest generation accepted among done[:k]
    after: list[dict[int, tuple[int, int]]] = [{}]
    for c in done:
        seen = dict(after[-1])
        if c.outcome == "ok":
            offset, generation = seen.get(c.partition, (-1, 0))
            seen[c.partition] = (max(offset, c.offset), max(generation, c.generation))
        after.append(seen)
    for i, c in enumerate(done):
        if c.outcome != "ok":
            continue
        offset, generation = after[i if c.sent is None else c.sent].get(c.partition, (-1, 0))
        if c.offset <= offset:
            verdict.reordered += 1
        if c.generation < generation:
            verdict.unexpected += 1  # accepted from a generation already replaced: fencing failed
    last = {p: offset for p, (offset, _) in after[-1].items()}
    verdict.lost = sum((final.get(p) or 0) < offset for p, offset in last.items())

    # An unknown commit may or may not have been stored: a final offset above the last accepted one
    # says it was, and it must then have been fenced and ordered as an accepted one is. A final offset
    # that no accepted or unknown commit could have set (a refused one's, or none's) is unexpected.
    def stored_rightly(i: int, c: Commit) -> bool:
        before, generation = after[i if c.sent is None else c.sent].get(c.partition, (-1, 0))
        owner = (c.member, c.generation, c.partition) in owned
        return owner and c.generation >= generation and c.offset > before

    for p, committed in final.items():
        if committed is None or committed <= last.get(p, -1):
            continue
        setters = [(i, c) for i, c in enumerate(done) if c.outcome == "unknown" and c.partition == p]
        if not any(stored_rightly(i, c) for i, c in setters if c.offset == committed):
            verdict.unexpected += 1
    return verdict


async def member(
    url: str, name: str, stop_at: float, assigned: list[Assigned], commits: list[Commit]
) -> None:
    async with StreamsClient(url, timeout=3.0) as client:
        generation = 0
        mine: tuple[int, ...] = ()
        next_offset: dict[int, int] = {}
        while time.monotonic() < stop_at:
            try:
                if not generation:
                    answer = await client.join(GROUP, member_id=name, session_timeout_secs=2.0)
                else:
                    answer = await client.heartbeat(GROUP, name)
            except UnknownMember:
                generation = 0  # evicted (a pause or a cut longer than the session): join again
                continue
            except (StreamError, aiohttp.ClientError, OSError, TimeoutError):
                await asyncio.sleep(0.2)
                continue
            if (answer["generation"], tuple(answer["partitions"])) != (generation, mine):
                generation, mine = answer["generation"], tuple(answer["partitions"])
                assigned.append(Assigned(name, generation, mine))
                next_offset = {}
            for p in mine:
                sent = len(commits)
                try:
                    if p not in next_offset:  # taken over: go on from the group's committed offset
                        next_offset[p] = (await client.committed(GROUP, p) or 0) + 1
                    sent = len(commits)
                    await client.commit(GROUP, p, next_offset[p], member_id=name, generation=generation)
                    commits.append(Commit(name, generation, p, next_offset[p], "ok", sent))
                    next_offset[p] += 1
                except REFUSED:
                    commits.append(Commit(name, generation, p, next_offset[p], "refused", sent))
                    break  # a rebalance: the next heartbeat says what is ours now
                except (StreamError, aiohttp.ClientError, OSError, TimeoutError):
                    if p in next_offset:
                        commits.append(Commit(name, generation, p, next_offset[p], "unknown", sent))
                        next_offset.pop(p)  # read the committed offset again before the next
                    break
            await asyncio.sleep(0.1)


async def run(servers: Servers, faults: list[Fault], duration: float, log: list[str]) -> dict[str, Verdict]:
    url = servers.url("a")
    async with StreamsClient(url, timeout=10.0) as client:
        await client.create_topic(TOPIC, PARTITIONS)
        await client.create_group(GROUP, TOPIC, session_timeout_secs=2.0)
        assigned: list[Assigned] = []
        commits: list[Commit] = []
        stop_at = time.monotonic() + duration
        members = [member(url, f"m{i}", stop_at, assigned, commits) for i in (1, 2, 3)]
        await asyncio.gather(run_schedule(servers, faults, log), *members)
        log.append(f"{len(commits)} commits in {len({a.generation for a in assigned})} generations")
        final = {p: await client.committed(GROUP, p) for p in range(PARTITIONS)}
    return {GROUP: check_group(assigned, commits, final)}


WORKLOAD = Workload(
    ("a",), ("isolate", "kill", "power", "pause"), streams_server(lambda servers, host: ()), run
)
