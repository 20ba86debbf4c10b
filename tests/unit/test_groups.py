"""The consumer-group coordinator: assignors, generations, fencing (pure, clock-injected)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from meshplane.core.groups import (
    GroupCoordinator,
    GroupError,
    GroupNotEmpty,
    IllegalGeneration,
    NotPartitionOwner,
    UnknownMember,
    assign,
)

MEMBERS = ["c1", "c2", "c3"]


def test_round_robin_matches_the_seed():
    assert assign("round_robin", MEMBERS, 6) == {"c1": [0, 3], "c2": [1, 4], "c3": [2, 5]}


def test_range_matches_the_seed():
    assert assign("range", MEMBERS, 6) == {"c1": [0, 1], "c2": [2, 3], "c3": [4, 5]}
    assert assign("range", MEMBERS, 7) == {"c1": [0, 1, 2], "c2": [3, 4], "c3": [5, 6]}


@pytest.mark.parametrize("strategy", ["round_robin", "range", "sticky"])
def test_assignors_do_not_depend_on_member_order(strategy):
    assert assign(strategy, ["b", "c", "a"], 5) == assign(strategy, ["a", "b", "c"], 5)


def test_sticky_keeps_owners_when_a_member_joins():
    before = {"a": [0, 1, 2], "b": [3, 4, 5]}
    after = assign("sticky", ["a", "b", "c"], 6, before)
    assert sorted(p for ps in after.values() for p in ps) == list(range(6))
    assert [len(after[m]) for m in "abc"] == [2, 2, 2]
    moved = sum(1 for m in "ab" for p in after[m] if p not in before[m])
    assert moved == 0  # a and b only gave partitions away


def test_sticky_never_leaves_a_partition_unowned():
    # Synap loses a partition with 2 partitions and 3 members.
    result = assign("sticky", ["a", "b", "c"], 2, {"a": [0], "b": [1]})
    assert result == {"a": [0], "b": [1], "c": []}
    result = assign("sticky", ["a", "b", "c"], 2, {"c": [0, 1]})
    assert sorted(p for ps in result.values() for p in ps) == [0, 1]


def test_every_change_is_a_new_generation():
    group = GroupCoordinator("g", "t", 4)
    assert group.join("a", 0).generation == 1
    assert group.join("b", 0).generation == 2
    assert group.leave("a", 1).generation == 3
    assert group.assignment == {"b": [0, 1, 2, 3]}


def test_session_timeout_evicts_and_rebalances():
    group = GroupCoordinator("g", "t", 2, session_timeout=10)
    group.join("a", 0)
    group.join("b", 5)
    assert group.expire(10) is None
    result = group.expire(10.5)
    assert result is not None
    assert result.evicted == ["a"]
    assert group.assignment == {"b": [0, 1]}
    with pytest.raises(UnknownMember, match="join again"):
        group.heartbeat("a", 11)


def test_heartbeat_keeps_a_member():
    group = GroupCoordinator("g", "t", 1, session_timeout=10)
    group.join("a", 0)
    for t in range(5, 100, 5):
        assert group.heartbeat("a", t) == 1
    assert list(group.members) == ["a"]


def test_commit_fencing():
    group = GroupCoordinator("g", "t", 2)
    first = group.join("a", 0).generation
    group.commit(0, 10, 1, "a", first)
    second = group.join("b", 2).generation
    owner_of_0 = group.owner_of(0)
    other = "b" if owner_of_0 == "a" else "a"
    with pytest.raises(IllegalGeneration, match="stale"):
        group.commit(0, 11, 3, owner_of_0, first)
    with pytest.raises(NotPartitionOwner):
        group.commit(0, 11, 3, other, second)
    with pytest.raises(UnknownMember):
        group.commit(0, 11, 3, "zed", second)
    with pytest.raises(GroupNotEmpty):
        group.commit(0, 11, 3)
    group.commit(0, 12, 3, owner_of_0, second)
    assert group.committed == {0: 12}


def test_standalone_commits_only_when_the_group_is_empty():
    group = GroupCoordinator("g", "t", 2)
    group.commit(1, 5, 0)
    assert group.committed == {1: 5}
    with pytest.raises(GroupError, match="does not exist"):
        group.commit(2, 5, 0)
    with pytest.raises(GroupError, match=">= 0"):
        group.commit(0, -1, 0)


def test_snapshot_restores_members_generation_and_offsets():
    group = GroupCoordinator("g", "t", 3, strategy="sticky", session_timeout=5)
    group.join("a", 0)
    group.join("b", 0)
    group.commit(0, 7, 0, group.owner_of(0), group.generation)
    restored = GroupCoordinator.restore(group.snapshot(), now=1000)
    assert restored.snapshot() == group.snapshot()
    assert restored.heartbeat("a", 1004) == group.generation  # a full session timeout from the restore


class GroupMachine(RuleBasedStateMachine):
    """Random joins, leaves, heartbeats, timeouts and commits keep the invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.partitions = 5
        self.group = GroupCoordinator("g", "t", self.partitions, strategy="sticky", session_timeout=10)
        self.now = 0.0
        self.next_id = 0
        self.known: list[str] = []
        self.generations_seen: set[int] = set()

    @rule(strategy=st.sampled_from(["round_robin", "range", "sticky"]))
    def switch_strategy(self, strategy):
        self.group.strategy = strategy

    @rule()
    def join(self):
        member = f"m{self.next_id:03d}"
        self.next_id += 1
        self.known.append(member)
        self.group.join(member, self.now)

    @precondition(lambda self: self.group.members)
    @rule(data=st.data())
    def leave(self, data):
        self.group.leave(data.draw(st.sampled_from(sorted(self.group.members))), self.now)

    @rule(seconds=st.floats(0, 15))
    def time_passes(self, seconds):
        self.now += seconds
        self.group.expire(self.now)

    @precondition(lambda self: self.group.members)
    @rule(data=st.data())
    def heartbeat(self, data):
        self.group.heartbeat(data.draw(st.sampled_from(sorted(self.group.members))), self.now)

    @precondition(lambda self: self.known)
    @rule(data=st.data(), partition=st.integers(0, 4), offset=st.integers(0, 100), stale=st.booleans())
    def commit(self, data, partition, offset, stale):
        member = data.draw(st.sampled_from(self.known))
        generation = self.group.generation - (1 if stale else 0)
        before = dict(self.group.committed)
        self.group.expire(self.now)
        owns = member in self.group.members and partition in self.group.assignment.get(member, [])
        try:
            self.group.commit(partition, offset, self.now, member, generation)
        except GroupError:
            assert self.group.committed == before
            assert stale or not owns
        else:
            assert owns
            assert not stale
            assert self.group.committed[partition] == offset

    @invariant()
    def every_partition_has_exactly_one_live_owner(self):
        owners = [p for m, ps in self.group.assignment.items() for p in ps]
        if self.group.members:
            assert sorted(owners) == list(range(self.partitions))
            assert set(self.group.assignment) == set(self.group.members)
            sizes = [len(ps) for ps in self.group.assignment.values()]
            assert max(sizes) - min(sizes) <= 1
        else:
            assert owners == []


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
