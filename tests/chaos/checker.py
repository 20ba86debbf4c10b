"""What a workload's history and the system's final state say (Elle's way: properties checked over
every operation, not a look at a sample).

A publisher publishes one event at a time and records each outcome: ``ok`` (acknowledged) or
``unknown`` (an error or no answer: it may or may not be stored). For every queue that wants a
publisher's events, the checker counts:

- lost: acknowledged, not in the queue;
- unreadable: acknowledged, and the store could not be read to tell (a 503 for the checker's whole
  wait): not served, though perhaps not lost; a column of its own;
- duplicated: in the queue more than once (whatever the outcome);
- reordered: acknowledged events of one publisher out of publishing order in the queue;
- unexpected: in the queue but never published (or not wanted by that queue);
- indeterminate: ``unknown`` outcomes, and how many of them arrived (either is allowed).

Direct events (:func:`check_direct`) are at most once: nothing is acknowledged, so nothing can be
lost; what did not arrive is counted as **gaps** in each publisher's sequence (allowed, reported),
and a copy twice, out of order or never published is wrong.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal

Outcome = Literal["ok", "unknown"]


@dataclass(frozen=True)
class Op:
    publisher: str
    seq: int
    outcome: Outcome
    offset: int | None = None  # where an acknowledged append was placed (topics)


@dataclass
class Verdict:
    operations: int = 0
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    unexpected: int = 0
    indeterminate: int = 0
    indeterminate_arrived: int = 0
    moved: int = 0  # acknowledged at one offset, found at another
    gaps: int = 0  # offsets missing between the log's first and last; direct events a subscriber missed
    unreadable: int = 0  # acknowledged, but the store could not be read to tell whether it holds them

    @property
    def valid(self) -> bool:
        return self.valid_for(at_most_once=False)

    def valid_for(self, *, at_most_once: bool) -> bool:
        """Nothing wrong; ``at_most_once`` (direct events): gaps are allowed."""
        wrong = (self.lost, self.unreadable, self.duplicated, self.reordered, self.unexpected, self.moved)
        return not any(wrong) and (at_most_once or self.gaps == 0)


def combined(verdicts: Iterable[Verdict]) -> Verdict:
    """Several queues' verdicts as one: the publishes counted once (the most any queue wanted), what
    went wrong summed over the queues."""
    total = Verdict()
    for verdict in verdicts:
        for f in fields(Verdict):
            pick = (
                max
                if f.name in ("operations", "acknowledged", "indeterminate", "indeterminate_arrived")
                else int.__add__
            )
            setattr(total, f.name, pick(getattr(total, f.name), getattr(verdict, f.name)))
    return total


def check_queues(
    history: Iterable[Op],
    queues: Mapping[str, Sequence[tuple[str, int]]],
    wants: Callable[[str, str], bool],
) -> dict[str, Verdict]:
    """One verdict per queue: ``queues`` maps a queue to the (publisher, seq) it holds, in its order;
    ``wants(queue, publisher)`` says whether that queue's patterns match the publisher's subject."""
    ops = list(history)
    outcomes = {(op.publisher, op.seq): op.outcome for op in ops}
    verdicts: dict[str, Verdict] = {}
    for queue, held in queues.items():
        mine = [op for op in ops if wants(queue, op.publisher)]
        counts = Counter(held)
        verdict = Verdict(
            operations=len(mine),
            acknowledged=sum(op.outcome == "ok" for op in mine),
            lost=sum(op.outcome == "ok" and counts[(op.publisher, op.seq)] == 0 for op in mine),
            duplicated=sum(n - 1 for n in counts.values()),
            unexpected=sum(n for key, n in counts.items() if key not in outcomes or not wants(queue, key[0])),
            indeterminate=sum(op.outcome == "unknown" for op in mine),
            indeterminate_arrived=sum(
                op.outcome == "unknown" and counts[(op.publisher, op.seq)] > 0 for op in mine
            ),
        )
        last: dict[str, int] = {}
        seen: set[tuple[str, int]] = set()
        for key in held:
            if key in seen or outcomes.get(key) != "ok":
                continue
            seen.add(key)
            publisher, seq = key
            if seq < last.get(publisher, -1):
                verdict.reordered += 1
            last[publisher] = max(seq, last.get(publisher, -1))
        verdicts[queue] = verdict
    return verdicts


def check_log(history: Iterable[Op], log: Sequence[tuple[int, str, int]]) -> Verdict:
    """A topic partition written by idempotent producers (each retries an unknown outcome with the
    same key, one event at a time): ``log`` is its (offset, publisher, seq) records in order. Every
    acknowledged append must be there once, at the offset it was given, in publishing order, and the
    offsets must run without a gap."""
    ops = list(history)
    outcomes = {(op.publisher, op.seq): op for op in ops}
    where: dict[tuple[str, int], list[int]] = {}
    for offset, publisher, seq in log:
        where.setdefault((publisher, seq), []).append(offset)
    offsets = [offset for offset, _, _ in log]
    verdict = Verdict(
        operations=len(ops),
        acknowledged=sum(op.outcome == "ok" for op in ops),
        lost=sum(op.outcome == "ok" and (op.publisher, op.seq) not in where for op in ops),
        duplicated=sum(len(places) - 1 for places in where.values()),
        unexpected=sum(len(places) for key, places in where.items() if key not in outcomes),
        indeterminate=sum(op.outcome == "unknown" for op in ops),
        indeterminate_arrived=sum(op.outcome == "unknown" and (op.publisher, op.seq) in where for op in ops),
        moved=sum(
            op.outcome == "ok"
            and (op.publisher, op.seq) in where
            and op.offset not in where[(op.publisher, op.seq)]
            for op in ops
        ),
        gaps=sum(b - a - 1 for a, b in itertools.pairwise(offsets) if b > a + 1),
    )
    last: dict[str, int] = {}
    # Order among the acknowledged events still where they were put (one lost is counted as lost).
    placed = sorted(
        (op.seq, op.publisher, op.offset)
        for op in ops
        if op.outcome == "ok" and op.offset is not None and op.offset in where.get((op.publisher, op.seq), ())
    )
    for _, publisher, offset in placed:
        if offset < last.get(publisher, -1):
            verdict.reordered += 1
        last[publisher] = max(offset, last.get(publisher, -1))
    return verdict


def unreadable(history: Iterable[Op]) -> Verdict:
    """The verdict when the final state could not be read at all: every acknowledged operation
    unreadable (not lost: nothing says it is gone)."""
    ops = list(history)
    acknowledged = sum(op.outcome == "ok" for op in ops)
    unknown = sum(op.outcome == "unknown" for op in ops)
    return Verdict(
        operations=len(ops), acknowledged=acknowledged, unreadable=acknowledged, indeterminate=unknown
    )


def check_direct(
    published: Mapping[str, int], received: Mapping[str, Sequence[tuple[str, int]]]
) -> dict[str, Verdict]:
    """One verdict per subscriber: ``published`` maps a publisher to how many events it sent (seq 0
    to n-1), ``received`` a subscriber to the (publisher, seq) it got, in arrival order."""
    total = sum(published.values())
    verdicts: dict[str, Verdict] = {}
    for subscriber, held in received.items():
        counts = Counter(held)
        known = {key for key in counts if 0 <= key[1] < published.get(key[0], 0)}
        verdict = Verdict(
            operations=total,
            duplicated=sum(n - 1 for key, n in counts.items() if key in known),
            unexpected=sum(n for key, n in counts.items() if key not in known),
            gaps=total - len(known),
        )
        last: dict[str, int] = {}
        for publisher, seq in held:
            if (publisher, seq) in known:
                if seq < last.get(publisher, -1):
                    verdict.reordered += 1
                last[publisher] = max(seq, last.get(publisher, -1))
        verdicts[subscriber] = verdict
    return verdicts
