"""Consumer groups on disk: the coordinators (``core/groups.py``), their snapshots and commit files.

Every change of a group goes through :meth:`GroupStore.changed` (saved, counted, members notified),
whichever request or timer caused it; commits are appended to ``<group>.offsets`` (a write each) and
folded into ``<group>.json`` every 10 000.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from meshplane.core.groups import STRATEGIES, GroupCoordinator, GroupError, Strategy
from meshplane.streams.config import check_name
from meshplane.streams.errors import BadRequest, Conflict, LimitReached, NotFound, storage_error
from meshplane.streams.events import Notifier
from meshplane.streams.files import RecordFile, changed, write_atomic

log = logging.getLogger(__name__)
COMPACT_EVERY = 10_000


class GroupStore:
    def __init__(
        self, folder: Path, counters: dict[str, int], *, sync: bool, report: Callable[[str], None]
    ) -> None:
        self.folder = folder
        self.groups: dict[str, GroupCoordinator] = {}
        self.notifier = Notifier()  # members waiting for a rebalance
        self._counters = counters
        self._sync = sync
        self._report = report
        self._commit_files: dict[str, RecordFile] = {}

    # --- lifecycle -----------------------------------------------------------------------------------

    def load(self, set_aside: Callable[[Path, str], None]) -> None:
        now = time.monotonic()
        for path in sorted(self.folder.glob("*.json")):
            try:
                group = GroupCoordinator.restore(json.loads(path.read_bytes()), now)
            except (ValueError, KeyError, TypeError) as exc:
                set_aside(path, f"consumer group file {path.name} is unreadable ({exc})")
                continue
            for payload in self._commits(group.group_id).load():
                try:
                    partition, offset = msgspec.msgpack.decode(payload)
                    group.committed[int(partition)] = int(offset)
                except (msgspec.DecodeError, ValueError, TypeError):
                    self._report(f"consumer group {group.group_id}: an unreadable commit record skipped")
            self.groups[group.group_id] = group
            try:
                self._save(group)  # folds the replayed commits into the snapshot
            except OSError as exc:  # a full disk: the commit file stays as it is, and is appended to
                log.warning("consumer group %s: not compacted (%s)", group.group_id, exc)

    def close(self) -> None:
        for commits in self._commit_files.values():
            commits.close()
        self._commit_files.clear()

    # --- groups --------------------------------------------------------------------------------------

    def create(
        self,
        group_id: str,
        topic: str,
        partitions: int,
        strategy: str,
        session_timeout: float,
    ) -> GroupCoordinator:
        check_name("group", group_id)
        if group_id in self.groups:
            raise Conflict(f"consumer group {group_id!r} already exists")
        group = new_group(group_id, topic, partitions, strategy, session_timeout)
        try:
            self._save(group)
        except OSError as exc:
            raise storage_error(exc, f"creating consumer group {group_id!r}") from exc
        self.groups[group_id] = group
        return group

    def get(self, group_id: str) -> GroupCoordinator:
        found = self.groups.get(check_name("group", group_id))
        if found is None:
            raise NotFound(f"consumer group {group_id!r} not found")
        return found

    def delete(self, group_id: str) -> bool:
        group = self.groups.pop(check_name("group", group_id), None)
        if group is None:
            return False
        self._commits(group_id).remove()
        del self._commit_files[group_id]
        (self.folder / f"{group_id}.json").unlink(missing_ok=True)
        changed(self.folder / f"{group_id}.json")
        return True

    def changed(self, group: GroupCoordinator) -> None:
        """A rebalance: saved, counted, and the members waiting for one woken."""
        self._counters["rebalances"] += 1
        try:
            self._save(group)
        except OSError as exc:
            # Membership is soft state (members rejoin after a restart); the commits are safe in
            # the snapshot and commit file as they were.
            raise storage_error(exc, f"saving consumer group {group.group_id!r}") from exc
        finally:
            self.notifier.notify()

    @contextmanager
    def watching(self, group: GroupCoordinator) -> Iterator[GroupCoordinator]:
        """Run a coordinator operation; if it moved the generation (join, leave, an expired member
        it noticed), the change is saved, counted and notified, even if the operation then failed."""
        before = group.generation
        try:
            yield group
        finally:
            if group.generation != before:
                self.changed(group)

    # --- membership ----------------------------------------------------------------------------------

    def join(self, group_id: str, member: str, session_timeout: float | None) -> tuple[int, list[int]]:
        group = self.get(group_id)
        with self.watching(group):
            result = group.join(member, time.monotonic(), session_timeout)
        return result.generation, result.assignment.get(member, [])

    def assignment(self, group_id: str, member: str) -> list[int]:
        group = self.get(group_id)
        with self.watching(group):
            return group.assignment_of(member, time.monotonic())

    def heartbeat(self, group_id: str, member: str) -> int:
        group = self.get(group_id)
        with self.watching(group):
            return group.heartbeat(member, time.monotonic())

    def leave(self, group_id: str, member: str) -> int:
        group = self.get(group_id)
        with self.watching(group):
            group.leave(member, time.monotonic())
        return group.generation

    def expire(self, group_id: str | None = None) -> None:
        """Evict members whose session ran out (all groups, or one: before its state is shown)."""
        now = time.monotonic()
        for group in [self.get(group_id)] if group_id is not None else list(self.groups.values()):
            with self.watching(group):
                group.expire(now)

    def resize(self, topic: str, partitions: int) -> None:
        for group in self.groups.values():
            if group.topic == topic:
                with self.watching(group):
                    group.resize(partitions, time.monotonic())

    # --- commits -------------------------------------------------------------------------------------

    def commit(
        self, group_id: str, partition: int, offset: int, member_id: str | None, generation: int | None
    ) -> RecordFile:
        """Commit an offset (written before this returns); the file to fsync by the policy."""
        group = self.get(group_id)
        previous = group.committed.get(partition)
        try:
            with self.watching(group):
                group.commit(partition, offset, time.monotonic(), member_id, generation)
        except GroupError:
            self._counters["commits_rejected"] += 1
            raise
        commits = self._commits(group_id)
        try:
            commits.append(msgspec.msgpack.encode((partition, offset)))
        except OSError as exc:
            if previous is None:
                group.committed.pop(partition, None)
            else:
                group.committed[partition] = previous
            raise storage_error(exc, f"commit of {group_id!r} partition {partition}") from exc
        self._counters["commits"] += 1
        if commits.records >= COMPACT_EVERY:
            try:
                self._save(group)  # the snapshot holds every commit
            except OSError as exc:
                log.warning("compacting the commits of %s failed (%s); kept as they are", group_id, exc)
        return commits

    def stats(self, group_id: str) -> dict[str, Any]:
        self.expire(group_id)
        return describe_group(self.get(group_id), time.monotonic())

    # --- files ---------------------------------------------------------------------------------------

    def _commits(self, group_id: str) -> RecordFile:
        commits = self._commit_files.get(group_id)
        if commits is None:
            commits = self._commit_files[group_id] = RecordFile(self.folder / f"{group_id}.offsets")
        return commits

    def _save(self, group: GroupCoordinator) -> None:
        """The snapshot, written atomically; then the commits it holds are dropped."""
        snapshot = json.dumps(group.snapshot()).encode()
        write_atomic(self.folder / f"{group.group_id}.json", snapshot, sync=self._sync)
        self._commits(group.group_id).remove()


def new_group(
    group_id: str, topic: str, partitions: int, strategy: str, session_timeout: float
) -> GroupCoordinator:
    """A new coordinator, its settings checked (a 400 for what is wrong)."""
    if strategy not in STRATEGIES:
        raise BadRequest(f"unknown strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
    strategy_name: Strategy = strategy  # type: ignore[assignment]
    try:
        return GroupCoordinator(
            group_id, topic, partitions, strategy=strategy_name, session_timeout=session_timeout
        )
    except GroupError as exc:
        raise BadRequest(str(exc)) from None


def describe_group(group: GroupCoordinator, now: float) -> dict[str, Any]:
    """A group's state as the stats route shows it (``now`` on the clock its rebalances were stamped)."""
    last = group.last_rebalance_at
    return {
        "group_id": group.group_id,
        "topic": group.topic,
        "state": group.state,
        "strategy": group.strategy,
        "member_count": len(group.members),
        "members": sorted(group.members),
        "generation": group.generation,
        "partition_count": group.partitions,
        "committed_partitions": len(group.committed),
        "assignment": group.assignment,
        "committed": {str(p): o for p, o in group.committed.items()},
        "last_rebalance_secs": None if last is None else round(now - last, 3),
    }


def check_new_group(groups: Collection[str], group_id: str, most: int) -> None:
    """Room for a new group within ``most`` (a name that exists is the store's Conflict)."""
    if group_id not in groups and len(groups) >= most:
        raise LimitReached(f"consumer group limit reached ({most} groups)", "groups")


def group_partitions(topic: str, topic_partitions: int | None, asked: int | None) -> int:
    """A new group's partition count: the topic's, or ``asked`` for a topic not made yet."""
    if asked is None:
        if topic_partitions is None:
            raise NotFound(f"topic {topic!r} not found (create it, or pass partition_count / --partitions)")
        return topic_partitions
    if topic_partitions is not None and asked != topic_partitions:
        raise BadRequest(f"topic {topic!r} has {topic_partitions} partitions, not {asked}")
    return asked
