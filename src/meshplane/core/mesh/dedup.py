"""Seed 004's dedup cache: recent event ids per topic, least recently used first out, each for a TTL.

Bounded three ways: ids per topic, topics, and age (an id lives between the TTL and 1.1 times it: the
expired are swept every tenth of the TTL). Time is passed in.

An event id is (timestamp, sequence, source, peer). A topic's ids are a ``PyIds`` (an OrderedDict, the
reference) or, where the C extension is built, a ``DedupIds`` (``dedup_ids.h``: the same order and
bounds, no Python object per id), which the direct path checks in C; a hypothesis test holds the two to
the same answers and contents.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from meshplane.core.compiled import compiled
from meshplane.errors import ConfigError

EventId = tuple[int, int, str | None, str | None]  # timestamp, sequence, source, peer
MAX_PER_TOPIC = 1 << 28  # what the C ids' 32-bit indexes allow


class Ids(Protocol):
    """One topic's ids: what both ``PyIds`` and the C ``DedupIds`` do."""

    def seen(self, key: EventId, now: float, /) -> bool: ...
    def expire(self, cutoff: float, /) -> None: ...
    def items(self) -> list[tuple[EventId, float]]: ...
    def __len__(self) -> int: ...


class PyIds:
    """The reference: up to ``bound`` ids, least recently seen first out."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._ids: OrderedDict[EventId, float] = OrderedDict()

    def seen(self, key: EventId, now: float, /) -> bool:
        """True when ``key`` is there (it becomes the newest, its stamp kept); else remembered at ``now``."""
        ids = self._ids
        if key in ids:
            ids.move_to_end(key)
            return True
        ids[key] = now
        if len(ids) > self.bound:
            ids.popitem(last=False)
        return False

    def expire(self, cutoff: float, /) -> None:
        """Forget ids from the oldest on while they were first seen at ``cutoff`` or before."""
        ids = self._ids
        while ids:
            oldest_id, stamp = next(iter(ids.items()))
            if stamp > cutoff:
                break
            del ids[oldest_id]

    def items(self) -> list[tuple[EventId, float]]:
        return list(self._ids.items())

    def __len__(self) -> int:
        return len(self._ids)


_frames = compiled("meshplane.core.mesh._frames")
#: The ids a cache makes by default: the C ones where the extension is built.
DEFAULT_IDS: Callable[[int], Ids] = _frames.DedupIds if _frames is not None else PyIds


class DedupCache:
    def __init__(
        self,
        per_topic: int = 1000,
        ttl_secs: float = 60.0,
        topics: int = 10_000,
        ids: Callable[[int], Ids] = DEFAULT_IDS,
    ) -> None:
        if per_topic > MAX_PER_TOPIC:
            raise ConfigError(f"dedup ids per topic: at most {MAX_PER_TOPIC}, got {per_topic}")
        self.per_topic = per_topic
        self.ttl_secs = ttl_secs
        self.max_topics = topics
        self._make_ids = ids
        self._topics: OrderedDict[str, Ids] = OrderedDict()
        self._recent_topic = ""  # the topic of the last call, and its ids: most calls repeat it
        self._recent_ids: Ids | None = None
        self._purge_at = 0.0
        self.duplicates = 0
        self.forgotten = 0  # topics dropped so far (a holder of a topic's ids must look it up again)

    def seen(self, topic: str, event_id: EventId, now: float) -> bool:
        """True when ``event_id`` was already seen on ``topic`` within the TTL (a duplicate);
        otherwise remembers it and returns False."""
        self.expire(now)
        ids = self._recent_ids
        if topic is not self._recent_topic or ids is None:
            ids = self._topics.get(topic)
            if ids is None:
                ids = self._topics[topic] = self._make_ids(self.per_topic)
                while len(self._topics) > self.max_topics:
                    self._topics.popitem(last=False)
                    self.forgotten += 1
            else:
                self._topics.move_to_end(topic)
            self._recent_topic, self._recent_ids = topic, ids
        if ids.seen(event_id, now):
            self.duplicates += 1
            return True
        return False

    def expire(self, now: float) -> None:
        """The sweep ``seen`` makes when it is due (the direct path calls it once per batch)."""
        if now >= self._purge_at:
            self._purge(now)

    def ids_of(self, topic: str) -> Ids | None:
        """``topic``'s ids as ``seen`` keeps them (the direct path adds to them in C), or None."""
        return self._topics.get(topic)

    def touch(self, topic: str, duplicates: int) -> None:
        """What ``seen`` does besides the ids, for a run of the topic's events checked in C."""
        if topic in self._topics:
            self._topics.move_to_end(topic)
        self.duplicates += duplicates

    def _purge(self, now: float) -> None:
        """Forget what is older than the TTL; done every tenth of it, not on every event."""
        cutoff = now - self.ttl_secs
        self._recent_ids = None  # its topic may go
        for topic in list(self._topics):
            ids = self._topics[topic]
            ids.expire(cutoff)
            if not ids:
                del self._topics[topic]
                self.forgotten += 1
        self._purge_at = now + self.ttl_secs / 10

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._topics.values())
