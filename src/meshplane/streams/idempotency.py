"""Answers to idempotent publishes, so that a repeated publish appends nothing."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from pathlib import Path

import msgspec

from meshplane.streams.files import RecordFile

log = logging.getLogger(__name__)


class IdempotencyTable:
    """The answers to recent idempotent publishes, kept in a file across restarts.

    Bounded three ways: at most ``capacity`` keys, about ``max_bytes`` of memory, and ``ttl`` seconds
    each; the oldest go first. A publish repeated within those bounds appends nothing; one repeated
    later appends again. Keys carry the topic's incarnation, so a topic deleted and made again
    starts with none.
    """

    ENTRY_OVERHEAD = 200  # bytes of a dict entry, its tuple and list, roughly

    def __init__(self, capacity: int = 100_000, max_bytes: int = 64 << 20, ttl: float = 7 * 86400.0) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.entries: OrderedDict[str, tuple[float, list[tuple[int, int]]]] = OrderedDict()
        self.bytes = 0
        self._file: RecordFile | None = None
        self._sync = True
        self.closed = False

    def open(self, path: Path, *, sync: bool = True) -> None:
        self._file, self._sync = RecordFile(path), sync
        now = time.time()
        for payload in self._file.load():
            try:
                key, places, at = msgspec.msgpack.decode(payload)
                self._remember(key, [(int(p), int(o)) for p, o in places], float(at))
            except (msgspec.DecodeError, ValueError, TypeError):
                continue  # an entry of an older format, or garbage: forgotten (the bound allows it)
        self.expire(now)
        try:
            self._rewrite()
        except OSError as exc:  # a full disk: appended to as it is, compacted later
            log.warning("%s: not compacted (%s)", path, exc)

    def get(self, key: str) -> list[tuple[int, int]] | None:
        found = self.entries.get(key)
        if found is None or found[0] < time.time() - self.ttl:
            return None
        return found[1]

    def put(self, key: str, places: list[tuple[int, int]]) -> None:
        """Remember an answer; written to the file first (an OSError leaves nothing remembered)."""
        at = time.time()
        if self._file is not None:
            self._file.append(msgspec.msgpack.encode((key, places, at)))
        self._remember(key, places, at)
        if self._file is not None and self._file.records > 2 * self.capacity:
            with contextlib.suppress(OSError):  # compaction can wait for a later put
                self._rewrite()

    def forget_topic(self, topic: str) -> None:
        prefix = topic + "/"
        for key in [k for k in self.entries if k.startswith(prefix)]:
            self._drop(key)

    def expire(self, now: float) -> None:
        while self.entries:
            key, (at, _) = next(iter(self.entries.items()))
            if at >= now - self.ttl:
                break
            self._drop(key)

    def _cost(self, key: str, places: list[tuple[int, int]]) -> int:
        return self.ENTRY_OVERHEAD + len(key) + 72 * len(places)

    def _remember(self, key: str, places: list[tuple[int, int]], at: float) -> None:
        if key in self.entries:
            self._drop(key)
        self.entries[key] = (at, places)
        self.bytes += self._cost(key, places)
        while len(self.entries) > self.capacity or (self.bytes > self.max_bytes and len(self.entries) > 1):
            self._drop(next(iter(self.entries)))

    def _drop(self, key: str) -> None:
        _, places = self.entries.pop(key)
        self.bytes -= self._cost(key, places)

    def _rewrite(self) -> None:
        """Compact the file to the entries kept."""
        if self._file is not None:
            payloads = [msgspec.msgpack.encode((k, p, at)) for k, (at, p) in self.entries.items()]
            self._file.rewrite(payloads, sync=self._sync)

    def sync_fd(self) -> int:
        assert self._file is not None
        return self._file.sync_fd()

    def __repr__(self) -> str:
        return f"idempotency answers {self._file}"

    def close(self) -> None:
        self.closed = True
        if self._file is not None:
            self._file.close()
