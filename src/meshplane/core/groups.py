"""The consumer-group coordinator: membership, generations, assignment and offset fencing.

Pure and clock-injected (every call takes ``now`` in seconds). Kafka's model is the anchor:

- every membership change (join, leave, session timeout) is a rebalance and bumps the generation;
- assignors are deterministic (members sorted by id) and every partition has exactly one owner in a
  generation while the group has members;
- a commit names its member and generation and is rejected from a stale generation, an unknown
  member or a member that does not own the partition; a commit without a member is accepted only
  while the group is empty (Kafka's rule for standalone consumers);
- the committed offset is the next offset to read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from meshplane.errors import BadRequest, Conflict, NotFound

Strategy = Literal["round_robin", "range", "sticky"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


class GroupError(BadRequest, ValueError):
    """A group operation that cannot be done (its ``kind`` says which rule it broke)."""

    kind = "GroupError"


class UnknownMember(GroupError, NotFound):
    kind = "UnknownMember"


class IllegalGeneration(GroupError, Conflict):
    kind = "IllegalGeneration"


class NotPartitionOwner(GroupError, Conflict):
    kind = "NotPartitionOwner"


class GroupNotEmpty(GroupError, Conflict):
    kind = "GroupNotEmpty"


@dataclass(slots=True)
class Member:
    member_id: str
    session_timeout: float
    last_heartbeat: float

    @property
    def deadline(self) -> float:
        return self.last_heartbeat + self.session_timeout


@dataclass(slots=True)
class RebalanceResult:
    generation: int
    assignment: dict[str, list[int]]
    evicted: list[str] = field(default_factory=list)


def assign(
    strategy: Strategy,
    members: Sequence[str],
    partitions: int,
    previous: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, list[int]]:
    """Assign ``range(partitions)`` to ``members``; deterministic for the same inputs."""
    ordered = sorted(members)
    result: dict[str, list[int]] = {m: [] for m in ordered}
    if not ordered:
        return result
    count = len(ordered)
    if strategy == "round_robin":
        for p in range(partitions):
            result[ordered[p % count]].append(p)
    elif strategy == "range":
        per, extra = divmod(partitions, count)
        start = 0
        for i, member in enumerate(ordered):
            size = per + (1 if i < extra else 0)
            result[member] = list(range(start, start + size))
            start += size
    elif strategy == "sticky":
        result = _sticky(ordered, partitions, previous or {})
    else:
        raise GroupError(f"unknown strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
    return result


def _sticky(
    ordered: list[str], partitions: int, previous: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
    """Balanced (sizes differ by at most one) while keeping as many previous owners as possible."""
    kept: dict[str, list[int]] = {}
    claimed: set[int] = set()
    for member in ordered:
        mine = sorted({p for p in previous.get(member, ()) if 0 <= p < partitions and p not in claimed})
        kept[member] = mine
        claimed.update(mine)
    per, extra = divmod(partitions, len(ordered))
    # The members holding the most get the larger quotas, so fewer partitions move.
    by_holdings = sorted(ordered, key=lambda m: (-len(kept[m]), m))
    capacity = {m: per + (1 if i < extra else 0) for i, m in enumerate(by_holdings)}
    result = {m: kept[m][: capacity[m]] for m in ordered}
    owned = {p for ps in result.values() for p in ps}
    for p in range(partitions):
        if p in owned:
            continue
        member = min((m for m in ordered if len(result[m]) < capacity[m]), key=lambda m: (len(result[m]), m))
        result[member].append(p)
    return {m: sorted(ps) for m, ps in result.items()}


class GroupCoordinator:
    """One consumer group of one topic."""

    def __init__(
        self,
        group_id: str,
        topic: str,
        partitions: int,
        *,
        strategy: Strategy = "round_robin",
        session_timeout: float = 30.0,
    ) -> None:
        if strategy not in STRATEGIES:
            raise GroupError(f"unknown strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
        if partitions < 1:
            raise GroupError("a group needs a topic with at least one partition")
        if session_timeout <= 0:
            raise GroupError("session_timeout must be positive")
        self.group_id = group_id
        self.topic = topic
        self.partitions = partitions
        self.strategy: Strategy = strategy
        self.session_timeout = session_timeout
        self.generation = 0
        self.members: dict[str, Member] = {}
        self.assignment: dict[str, list[int]] = {}
        self.committed: dict[int, int] = {}
        self.last_rebalance_at: float | None = None
        self.rebalances = 0

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"

    def _rebalance(self, now: float, evicted: Sequence[str] = ()) -> RebalanceResult:
        self.generation += 1
        self.rebalances += 1
        self.assignment = assign(self.strategy, list(self.members), self.partitions, self.assignment)
        self.last_rebalance_at = now
        return RebalanceResult(self.generation, dict(self.assignment), list(evicted))

    def join(self, member_id: str, now: float, session_timeout: float | None = None) -> RebalanceResult:
        """Add (or re-add) a member; a rebalance follows and the new generation is returned."""
        timeout = self.session_timeout if session_timeout is None else session_timeout
        if timeout <= 0:
            raise GroupError("session_timeout must be positive")
        evicted = self._expired(now)
        self.members[member_id] = Member(member_id, timeout, now)
        return self._rebalance(now, evicted)

    def leave(self, member_id: str, now: float) -> RebalanceResult:
        self._require(member_id)
        del self.members[member_id]
        return self._rebalance(now, self._expired(now))

    def resize(self, partitions: int, now: float) -> RebalanceResult:
        """The topic grew: a rebalance spreads the new partitions."""
        if partitions < self.partitions:
            raise GroupError(f"a topic never shrinks ({self.partitions} -> {partitions} partitions)")
        self.partitions = partitions
        return self._rebalance(now, self._expired(now))

    def heartbeat(self, member_id: str, now: float) -> int:
        """Keep a member alive; returns the current generation (a new one means: fetch the assignment)."""
        self.expire(now)
        self._require(member_id).last_heartbeat = now
        return self.generation

    def expire(self, now: float) -> RebalanceResult | None:
        """Evict members whose session timed out; rebalances if any was evicted."""
        evicted = self._expired(now)
        return self._rebalance(now, evicted) if evicted else None

    def _expired(self, now: float) -> list[str]:
        gone = [m.member_id for m in self.members.values() if now > m.deadline]
        for member_id in gone:
            del self.members[member_id]
        return gone

    def assignment_of(self, member_id: str, now: float) -> list[int]:
        self.expire(now)
        self._require(member_id)
        return list(self.assignment.get(member_id, []))

    def owner_of(self, partition: int) -> str | None:
        for member_id, owned in self.assignment.items():
            if partition in owned:
                return member_id
        return None

    def commit(
        self,
        partition: int,
        offset: int,
        now: float,
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        """Record ``offset`` (the next offset to read) for ``partition``, if the caller may."""
        if not 0 <= partition < self.partitions:
            raise GroupError(f"partition {partition} does not exist (0..{self.partitions - 1})")
        if offset < 0:
            raise GroupError(f"offset must be >= 0, not {offset}")
        self.expire(now)
        if member_id is None:
            if self.members:
                raise GroupNotEmpty(
                    f"group {self.group_id!r} has live members: commits must name member_id and generation"
                )
        else:
            self._require(member_id)
            if generation is None or generation != self.generation:
                raise IllegalGeneration(
                    f"generation {generation} is stale: group {self.group_id!r} is at generation "
                    f"{self.generation}; fetch the assignment again"
                )
            if partition not in self.assignment.get(member_id, []):
                raise NotPartitionOwner(
                    f"member {member_id} does not own partition {partition} in generation {self.generation}"
                )
            self.members[member_id].last_heartbeat = now
        self.committed[partition] = offset

    def _require(self, member_id: str) -> Member:
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMember(
                f"member {member_id} is not in group {self.group_id!r} (left or timed out): join again"
            )
        return member

    # --- persistence ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "topic": self.topic,
            "partitions": self.partitions,
            "strategy": self.strategy,
            "session_timeout": self.session_timeout,
            "generation": self.generation,
            "members": {m.member_id: m.session_timeout for m in self.members.values()},
            "assignment": self.assignment,
            "committed": {str(p): o for p, o in self.committed.items()},
        }

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any], now: float) -> GroupCoordinator:
        """Rebuild a group; restored members get a full session timeout from ``now`` to heartbeat."""
        group = cls(
            snapshot["group_id"],
            snapshot["topic"],
            int(snapshot["partitions"]),
            strategy=snapshot["strategy"],
            session_timeout=float(snapshot["session_timeout"]),
        )
        group.generation = int(snapshot["generation"])
        group.members = {
            m: Member(m, float(timeout), now) for m, timeout in dict(snapshot["members"]).items()
        }
        group.assignment = {m: list(ps) for m, ps in dict(snapshot["assignment"]).items()}
        group.committed = {int(p): int(o) for p, o in dict(snapshot["committed"]).items()}
        return group
