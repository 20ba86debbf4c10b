"""Which peer's queues want what, kept on disk as a log of changes (``peer_queues.log``; a gateway keeps the
other clusters' in ``cluster_queues.log``): one JSON line per change, appended in O(change) and fsynced
on the node's tick; compacted (rewritten whole, atomically) once it holds far more lines than the state.
A torn last line (a crash mid-append) is skipped; what it held is learnt again when that peer links. The
whole-file ``peer_queues.json`` of older versions is read once and replaced by the log."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import msgspec

from meshplane.core.subjects import PatternIndex, valid_pattern
from meshplane.mesh.queues import PREFIX
from meshplane.streams.files import changed, write_atomic

log = logging.getLogger(__name__)

LOG_FILE = "peer_queues.log"
LEGACY_FILE = "peer_queues.json"
COMPACT_AFTER = 1000  # lines beyond twice the state's before the log is rewritten
MATCHES_CACHED = 4096  # subjects whose matching keys are remembered


class Change(msgspec.Struct, omit_defaults=True):
    peer: str
    add: list[str] = []
    remove: list[str] = []
    forget: bool = False


_decode_change = msgspec.json.Decoder(Change).decode
_encode = msgspec.json.Encoder().encode


class PeerQueuesLog:
    def __init__(self, root: Path, name: str = LOG_FILE) -> None:
        self.path = root / name
        self._legacy = root / LEGACY_FILE if name == LOG_FILE else None
        self._lines = 0
        self._fd: int | None = None
        self._dirty = False

    def load(self) -> dict[str, set[str]]:
        state: dict[str, set[str]] = {}
        legacy: dict[str, list[str]] = {}
        if self._legacy is not None:
            with contextlib.suppress(OSError, msgspec.DecodeError):
                legacy = msgspec.json.decode(self._legacy.read_bytes(), type=dict[str, list[str]])
        for peer, patterns in legacy.items():
            state[peer] = set(patterns)
        for change in self._read():
            self._lines += 1
            self._apply(state, change)
        if legacy and self._legacy is not None:
            self.compact(state)
            self._legacy.unlink(missing_ok=True)
            changed(self._legacy)
        return state

    def _read(self) -> Iterator[Change]:
        try:
            data = self.path.read_bytes()
        except OSError:
            return
        for line in data.splitlines():
            try:
                yield _decode_change(line)
            except msgspec.DecodeError:
                log.warning("%s: skipped a torn or unreadable line", self.path)

    @staticmethod
    def _apply(state: dict[str, set[str]], change: Change) -> None:
        if change.forget:
            state.pop(change.peer, None)
            return
        patterns = (state.get(change.peer, set()) | set(change.add)) - set(change.remove)
        if patterns:
            state[change.peer] = patterns
        else:
            state.pop(change.peer, None)

    def append(self, change: Change, state: dict[str, set[str]]) -> None:
        """Record one change (``state`` is what it led to: compacted into when the log grew long)."""
        try:
            if self._lines > COMPACT_AFTER + 2 * len(state):
                self.compact(state)
                return
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, _encode(change) + b"\n")
            changed(self.path)
            self._lines += 1
            self._dirty = True
        except OSError as exc:  # kept in memory; a restart learns them again when the peers link
            log.warning("could not record the peers' queues: %s", exc)

    def compact(self, state: dict[str, set[str]]) -> None:
        self.close()
        lines = [_encode(Change(peer, sorted(patterns))) + b"\n" for peer, patterns in sorted(state.items())]
        try:
            write_atomic(self.path, b"".join(lines))
            self._lines = len(lines)
        except OSError as exc:
            log.warning("could not compact the peers' queues: %s", exc)

    def sync(self) -> None:
        if self._fd is not None and self._dirty:
            try:
                os.fsync(self._fd)
                self._dirty = False
            except OSError as exc:
                log.warning("could not sync the peers' queues: %s", exc)

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None


class KnownQueues:
    """The queues' patterns (without the ``$G.`` prefix) of each peer, or of each other cluster, as
    announced, remembered on disk and matched: whose spool a guaranteed event goes to. ``on_change``
    hears each key's patterns gained and lost."""

    def __init__(self, root: Path, name: str, on_change: Callable[[str, set[str], set[str]], None]) -> None:
        self.by_key: dict[str, set[str]] = {}
        self._index: PatternIndex[str] = PatternIndex()
        self._matches: dict[str, frozenset[str]] = {}  # by subject; emptied on any change, or when full
        self._log = PeerQueuesLog(root, name)
        self._on_change = on_change

    def load(self) -> None:
        for key, patterns in self._log.load().items():
            self._set(key, {p for p in patterns if valid_pattern(p) is not None})

    def match(self, subject: str) -> frozenset[str]:
        """The keys whose queues want ``subject`` (asked for each guaranteed event: cached)."""
        keys = self._matches.get(subject)
        if keys is None:
            if len(self._matches) >= MATCHES_CACHED:
                self._matches.clear()
            keys = self._matches[subject] = frozenset(self._index.match(subject))
        return keys

    def learnt(self, key: str, added: Iterable[str], removed: Iterable[str]) -> None:
        have = self.by_key.get(key, set())
        self.replace(key, (have | set(added)) - set(removed))

    def replace(self, key: str, patterns: set[str]) -> None:
        """``key``'s queues are exactly ``patterns`` now (its interest learnt afresh)."""
        have = self.by_key.get(key, set())
        if patterns != have:
            self._set(key, patterns)
            self._log.append(Change(key, sorted(patterns - have), sorted(have - patterns)), self.by_key)

    def forget(self, key: str) -> int:
        patterns = self.by_key.get(key, set())
        self._set(key, set())
        self._log.append(Change(key, forget=True), self.by_key)
        return len(patterns)

    def _set(self, key: str, patterns: set[str]) -> None:
        self._matches.clear()
        have = self.by_key.pop(key, set())
        for pattern in have - patterns:
            self._index.remove(pattern, key)
        for pattern in patterns - have:
            self._index.insert(pattern, key)
        if patterns:
            self.by_key[key] = patterns
        self._on_change(key, patterns - have, have - patterns)

    def sync(self) -> None:
        self._log.sync()

    def close(self) -> None:
        self._log.close()


def learn_queues(known: KnownQueues | None, key: str, gained: Iterable[str], lost: Iterable[str]) -> None:
    """Queues' interest gained or lost, if any: most interest is no queue's (nothing to copy then)."""
    gained, lost = queue_patterns(gained), queue_patterns(lost)
    if known is not None and (gained or lost):
        known.learnt(key, gained, lost)


def queue_patterns(interest: Iterable[str]) -> set[str]:
    """The queues' patterns among announced interest, without their prefix."""
    return {p[len(PREFIX) :] for p in interest if p.startswith(PREFIX)}
