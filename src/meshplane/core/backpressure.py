"""A subscriber's queue, bounded in count and bytes, with seed 004's policies when it is full:
``drop_oldest`` (make room), ``drop_newest`` (refuse the new one) or ``disconnect`` (the subscriber
is too slow to keep: the adapter closes it). Every drop is counted."""

from __future__ import annotations

from collections import deque
from typing import Generic, Literal, TypeVar

BackpressurePolicy = Literal["drop_oldest", "drop_newest", "disconnect"]
POLICIES: tuple[BackpressurePolicy, ...] = ("drop_oldest", "drop_newest", "disconnect")

T = TypeVar("T")


class SubscriberQueue(Generic[T]):
    def __init__(self, max_messages: int, max_bytes: int, policy: BackpressurePolicy = "drop_newest") -> None:
        if policy not in POLICIES:
            raise ValueError(f"backpressure policy {policy!r}: one of {', '.join(POLICIES)}")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.policy = policy
        self.items: deque[tuple[T, int]] = deque()
        self.bytes = 0
        self.dropped = 0
        self.overflowed = False  # with "disconnect": the queue filled up; the subscriber must go

    def offer(self, item: T, size: int) -> bool:
        """Queue ``item`` (with drop_oldest, after dropping older ones); False when it was dropped."""
        if self.overflowed:
            self.dropped += 1
            return False
        if len(self.items) < self.max_messages and self.bytes + size <= self.max_bytes:
            self._push(item, size)
            return True
        if self.policy == "drop_newest" or size > self.max_bytes:
            self.dropped += 1
            return False
        if self.policy == "disconnect":
            self.overflowed = True
            self.dropped += 1
            return False
        while self.items and (len(self.items) >= self.max_messages or self.bytes + size > self.max_bytes):
            _, old_size = self.items.popleft()
            self.bytes -= old_size
            self.dropped += 1
        self._push(item, size)
        return True

    def _push(self, item: T, size: int) -> None:
        self.items.append((item, size))
        self.bytes += size

    def take(self) -> T:
        item, size = self.items.popleft()
        self.bytes -= size
        return item

    def take_all(self) -> list[T]:
        items = [item for item, _ in self.items]
        self.items.clear()
        self.bytes = 0
        return items

    def __len__(self) -> int:
        return len(self.items)
