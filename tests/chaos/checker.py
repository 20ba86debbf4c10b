"""What a workload's history and the system's final state say (Elle's way: properties checked over
every operation, not a look at a sample).

A publisher publishes one event at a time and records each outcome: ``ok`` (acknowledged) or
``unknown`` (an error or no answer: it may or may not be stored). For every queue that wants a
publisher's events, the checker counts:

- lost: acknowledged, not in the queue;
- duplicated: in the queue more than once (whatever the outcome);
- reordered: acknowledged events of one publisher out of publishing order in the queue;
- unexpected: in the queue but never published (or not wanted by that queue);
- indeterminate: ``unknown`` outcomes, and how many of them arrived (either is allowed).
"""

from __future__ import annotations

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

    @property
    def valid(self) -> bool:
        return self.lost == self.duplicated == self.reordered == self.unexpected == 0


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
