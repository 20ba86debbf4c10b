"""Which fault, when, on which hosts: drawn from a seed, so a run that fails is replayed exactly.

Pure: the harness applies a :class:`Fault` at ``start`` and heals it ``length`` seconds later; faults
come one at a time with a quiet gap between them, and the last ends before ``duration``. The kinds
come in rounds (each once per round, in a random order), so a schedule long enough has them all.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# One host: isolate (its switch port down), cap (tbf at a few hundred kbit/s), kill (SIGKILL, restarted
# at heal with its data), power (SIGKILL and what its disk had not fsynced gone), pause (SIGSTOP,
# SIGCONT at heal). Two hosts: cut (both ways), one-way (the first's packets to the second dropped),
# slow (latency and jitter both ways, from the harness's proxy on the link: workloads whose servers
# dial each other through it). Every host: power-all. clock (a host's wall clock steps ahead, and back
# at heal) only for workloads whose servers watch the harness's clock file, on those servers' hosts.
SINGLE = ("isolate", "cap", "kill", "power", "pause", "clock")
PAIRED = ("cut", "one-way", "slow")
EVERY = ("power-all",)  # every host at once: a coordinated power failure
NEMESES = tuple(kind for kind in (*SINGLE, *PAIRED, *EVERY) if kind not in ("slow", "clock"))
LINK_NEMESES = (*NEMESES, "slow")  # for workloads with a proxy on each link
KNOWN = (*NEMESES, "slow", "clock")


def refuse_inert(workload: str, kinds: Sequence[str], acting: Sequence[str]) -> None:
    """A nemesis that cannot act on the workload is refused, never applied as a no-op: ``slow``
    needs the proxies a workload's servers dial through, ``clock`` servers that watch the clock file."""
    inert = [kind for kind in kinds if kind not in acting]
    if inert:
        raise ValueError(
            f"{', '.join(inert)} cannot act on workload {workload} (it takes {', '.join(acting)})"
        )


@dataclass(frozen=True)
class Fault:
    start: float
    length: float
    kind: str
    hosts: tuple[str, ...]

    def describe(self) -> str:
        where = " -> ".join(self.hosts) if self.kind == "one-way" else " / ".join(self.hosts)
        return f"{self.start:6.1f}s +{self.length:4.1f}s {self.kind} {where}"


def plan(
    seed: int,
    duration: float,
    hosts: Sequence[str],
    kinds: Sequence[str] = NEMESES,
    *,
    gap: tuple[float, float] = (1.0, 3.0),
    length: tuple[float, float] = (2.0, 6.0),
    clocked: Sequence[str] = (),
) -> list[Fault]:
    """``clocked``: the hosts the clock nemesis falls on (default: any of ``hosts``)."""
    unknown = sorted(set(kinds) - set(KNOWN))
    if unknown or not kinds:
        known = ", ".join(KNOWN)
        raise ValueError(f"nemeses must be some of {known} (got {', '.join(unknown) or 'none'})")
    if any(kind in PAIRED for kind in kinds) and len(hosts) < 2:
        raise ValueError("cut, one-way and slow need two hosts")
    rng = random.Random(seed)
    faults: list[Fault] = []
    now = rng.uniform(*gap)
    round_: list[str] = []
    while True:
        if not round_:
            round_ = rng.sample(list(kinds), len(kinds))
        kind = round_.pop()
        span = rng.uniform(*length)
        if now + span > duration:
            return faults
        pool = list(clocked) if kind == "clock" and clocked else list(hosts)
        chosen = tuple(hosts) if kind in EVERY else tuple(rng.sample(pool, 2 if kind in PAIRED else 1))
        faults.append(Fault(round(now, 3), round(span, 3), kind, chosen))
        now += span + rng.uniform(*gap)
