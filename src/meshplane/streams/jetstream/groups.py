"""Consumer groups in a replicated JetStream key-value bucket, one key per group.

Every change is read, applied by the pure coordinator (``core/groups.py``) and written back with
compare-and-set on the key's revision: two servers changing one group at once both retry on the
newer state, so generations, fencing and commits hold across servers. Session deadlines are wall
clock (``time.time``), the one clock the servers share.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from meshplane.core.groups import GroupCoordinator, GroupError
from meshplane.streams.config import check_name
from meshplane.streams.errors import Conflict, NotFound
from meshplane.streams.events import Notifier
from meshplane.streams.groups import new_group
from meshplane.streams.jetstream.naming import escape, unescape
from meshplane.streams.jetstream.store import Unavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_ATTEMPTS = 50  # compare-and-set retries under contention before answering 503


def encode_group(group: GroupCoordinator) -> bytes:
    state = group.snapshot()
    state["heartbeats"] = {m.member_id: m.last_heartbeat for m in group.members.values()}
    state["last_rebalance_at"] = group.last_rebalance_at
    return json.dumps(state, sort_keys=True).encode()


def decode_group(raw: bytes) -> GroupCoordinator:
    state = json.loads(raw)
    group = GroupCoordinator.restore(state, time.time())
    for member_id, seen in dict(state.get("heartbeats", {})).items():
        if member_id in group.members:
            group.members[member_id].last_heartbeat = float(seen)
    group.last_rebalance_at = state.get("last_rebalance_at")
    return group


class SharedGroups:
    """The groups as this server last saw them (for views), and every change made through the bucket."""

    def __init__(
        self, kv: KeyValue, counters: dict[str, int], clock: Callable[[], float] = time.time
    ) -> None:
        self.kv = kv
        self.groups: dict[str, GroupCoordinator] = {}
        self.notifier = Notifier()
        self._counters = counters
        self._clock = clock

    def seen(self, key: str, value: bytes | None) -> None:
        """A watched change (from any server): the view follows, waiting members are woken."""
        name = unescape(key)
        if value is None:
            self.groups.pop(name, None)
        else:
            try:
                self.groups[name] = decode_group(value)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("consumer group %s: unreadable state in JetStream (%s)", name, exc)
                return
        self.notifier.notify()

    async def create(
        self, group_id: str, topic: str, partitions: int, strategy: str, session_timeout: float
    ) -> GroupCoordinator:
        group = new_group(check_name("group", group_id), topic, partitions, strategy, session_timeout)
        try:
            await self.kv.create(escape(group_id), encode_group(group))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise Conflict(f"consumer group {group_id!r} already exists") from None
        except nats.errors.TimeoutError:
            raise Unavailable(f"JetStream did not store consumer group {group_id!r}") from None
        self.groups[group_id] = group
        return group

    async def load(self, group_id: str) -> tuple[GroupCoordinator, int]:
        try:
            entry = await self.kv.get(escape(check_name("group", group_id)))
        except nats.js.errors.KeyNotFoundError:
            self.groups.pop(group_id, None)
            raise NotFound(f"consumer group {group_id!r} not found") from None
        except nats.errors.TimeoutError:
            raise Unavailable(f"JetStream did not answer for consumer group {group_id!r}") from None
        assert entry.value is not None
        assert entry.revision is not None
        group = decode_group(entry.value)
        self.groups[group_id] = group
        return group, entry.revision

    async def delete(self, group_id: str) -> bool:
        try:
            await self.load(group_id)
            await self.kv.delete(escape(group_id))
        except NotFound:
            return False
        self.groups.pop(group_id, None)
        return True

    async def change(self, group_id: str, operation: Callable[[GroupCoordinator, float], T]) -> T:
        """Apply ``operation`` to the newest state and store it if it changed anything (an eviction
        it noticed is stored even when the operation itself is refused)."""
        for _ in range(MAX_ATTEMPTS):
            group, revision = await self.load(group_id)
            before, generation = encode_group(group), group.generation
            refused: GroupError | None = None
            result: Any = None
            try:
                result = operation(group, self._clock())
            except GroupError as exc:
                refused = exc
            after = encode_group(group)
            if after != before:
                try:
                    await self.kv.update(escape(group_id), after, last=revision)
                except nats.js.errors.KeyWrongLastSequenceError:
                    continue  # another server changed it first: apply to its state
                except nats.errors.TimeoutError:
                    raise Unavailable(f"JetStream did not store consumer group {group_id!r}") from None
                self.groups[group_id] = group
                if group.generation != generation:
                    self._counters["rebalances"] += 1
                    self.notifier.notify()
            if refused is not None:
                raise refused
            return result  # type: ignore[no-any-return]
        raise Unavailable(f"consumer group {group_id!r} is changed by too many at once; try again")
