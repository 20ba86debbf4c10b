"""Interest tables: what this node's clients want (aggregated) and what each peer wants (its copy).

Each node owns its interest and versions it with one counter (the seed's vector clock, where each
node writes only its own entry): every SUB_ADD / SUB_REMOVE carries the version it made. A peer's
copy keeps, per pattern, the version of the last update it applied, so an update older than what it
knows (a replay, a late frame) never undoes a newer one.

Anti-entropy: patterns fall into :data:`BUCKETS` buckets; a bucket's hash covers its patterns and
the root covers the buckets (a Merkle tree of two levels). Heartbeats carry the owner's root; a copy
whose root differs asks for the leaves' differences and gets those buckets' whole content back.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import OrderedDict
from collections.abc import Iterable

from meshplane.core.mesh.frames import InterestChange

BUCKETS = 64
HASH_BYTES = 8
EMPTY_BUCKET = hashlib.blake2b(b"", digest_size=HASH_BYTES).digest()


def bucket_of(pattern: str) -> int:
    return zlib.crc32(pattern.encode()) % BUCKETS


def bucket_hash(patterns: Iterable[str]) -> bytes:
    return hashlib.blake2b("\n".join(sorted(patterns)).encode(), digest_size=HASH_BYTES).digest()


def root_of(leaves: list[bytes]) -> bytes:
    return hashlib.blake2b(b"".join(leaves), digest_size=HASH_BYTES).digest()


MAX_CHANGES_PER_SECOND = 1_000_000  # interest versions a node can make, at most (one a microsecond)
VERSION_SLACK = 1_000_000


def version_ceiling(known: int, epoch_ns: int, now_ns: int) -> int:
    """The highest interest version a peer may send next: far ahead of the highest seen (``known``)
    once there is one, else beyond what a node started at ``epoch_ns`` can have made by ``now_ns``.
    A version past it is a protocol error: applied, it would outrank every later update of the real
    node (a tombstone nobody could lift). Every change is seen on a link (SUB_* frames are never
    dropped; a new link starts from 0), so a legitimate jump stays small."""
    if known:
        return known + VERSION_SLACK
    return max(0, now_ns - epoch_ns) * MAX_CHANGES_PER_SECOND // 1_000_000_000 + VERSION_SLACK


def encode_leaves(leaves: list[bytes]) -> bytes:
    return b"".join(leaves)


def decode_leaves(payload: bytes) -> list[bytes]:
    if len(payload) != BUCKETS * HASH_BYTES:
        raise ValueError(f"a digest of {len(payload)} bytes, not {BUCKETS * HASH_BYTES}")
    return [payload[i : i + HASH_BYTES] for i in range(0, len(payload), HASH_BYTES)]


class _Buckets:
    """Patterns by bucket, with each bucket's hash computed once per change."""

    def __init__(self) -> None:
        self.buckets: list[set[str]] = [set() for _ in range(BUCKETS)]
        self._leaves: list[bytes | None] = [EMPTY_BUCKET] * BUCKETS

    def add(self, pattern: str, index: int | None = None) -> None:
        """``index``: the pattern's bucket, when the caller has it already."""
        index = bucket_of(pattern) if index is None else index
        self.buckets[index].add(pattern)
        self._leaves[index] = None

    def discard(self, pattern: str, index: int | None = None) -> None:
        index = bucket_of(pattern) if index is None else index
        self.buckets[index].discard(pattern)
        self._leaves[index] = None

    def leaves(self) -> list[bytes]:
        for i, leaf in enumerate(self._leaves):
            if leaf is None:
                self._leaves[i] = bucket_hash(self.buckets[i])
        return [leaf for leaf in self._leaves if leaf is not None]

    def root(self) -> bytes:
        return root_of(self.leaves())

    def differing(self, leaves: list[bytes]) -> list[int]:
        return [
            i for i, (mine, theirs) in enumerate(zip(self.leaves(), leaves, strict=True)) if mine != theirs
        ]


class OwnInterest:
    """This node's aggregated interest: a pattern is announced when its first holder arrives and
    withdrawn when its last leaves; churn in between is invisible to peers."""

    def __init__(self) -> None:
        self.holders: dict[str, int] = {}
        self.version = 0
        self._buckets = _Buckets()

    def add(self, pattern: str) -> int | None:
        """One more holder of ``pattern``; the new version when peers must hear of it (the first)."""
        count = self.holders.get(pattern, 0)
        self.holders[pattern] = count + 1
        if count:
            return None
        self._buckets.add(pattern)
        self.version += 1
        return self.version

    def remove(self, pattern: str) -> int | None:
        """One holder fewer; the new version when it was the last (peers must hear of it)."""
        count = self.holders.get(pattern, 0)
        if count == 0:
            return None
        if count > 1:
            self.holders[pattern] = count - 1
            return None
        del self.holders[pattern]
        self._buckets.discard(pattern)
        self.version += 1
        return self.version

    def root(self) -> bytes:
        return self._buckets.root()

    def answer(self, leaves: list[bytes]) -> dict[int, list[str]]:
        """The whole content of every bucket whose hash differs from the asker's."""
        return {i: sorted(self._buckets.buckets[i]) for i in self._buckets.differing(leaves)}


class PeerInterest:
    """A peer's interest as this node knows it, versioned per pattern.

    ``tombstones`` remember removed patterns' versions (bounded, oldest forgotten first); a bucket's
    ``floor`` is the version of the last full answer for it, below which nothing applies there.
    """

    def __init__(self, max_tombstones: int = 100_000) -> None:
        self.versions: dict[str, int] = {}
        self.tombstones: OrderedDict[str, int] = OrderedDict()
        self.max_tombstones = max_tombstones
        self.floors = [0] * BUCKETS
        self.version = 0  # the highest owner version seen
        self.stale_ignored = 0
        self._buckets = _Buckets()

    @property
    def patterns(self) -> set[str]:
        return set(self.versions)

    def apply(self, pattern: str, version: int, added: bool) -> bool:
        """A SUB_ADD (``added``) or SUB_REMOVE; True when the copy changed."""
        if version > self.version:
            self.version = version
        index = bucket_of(pattern)
        if (
            version <= self.floors[index]
            or version <= self.versions.get(pattern, 0)
            or version <= self.tombstones.get(pattern, 0)
        ):
            self.stale_ignored += 1
            return False
        if added:
            self.tombstones.pop(pattern, None)
            changed = pattern not in self.versions
            self.versions[pattern] = version
            self._buckets.add(pattern, index)
            return changed
        self._bury(pattern, version)
        if self.versions.pop(pattern, None) is None:
            return False
        self._buckets.discard(pattern, index)
        return True

    def apply_many(self, changes: Iterable[InterestChange]) -> tuple[set[str], set[str]]:
        """An INTEREST frame: :meth:`apply` of each change in order. Returns the patterns the copy
        gained and lost, net of each other (one added, then removed, is neither)."""
        gained: set[str] = set()
        lost: set[str] = set()
        apply = self.apply
        for change in changes:
            pattern = change.pattern
            if not apply(pattern, change.version, change.added):
                continue
            if change.added:
                if pattern in lost:
                    lost.discard(pattern)
                else:
                    gained.add(pattern)
            elif pattern in gained:
                gained.discard(pattern)
            else:
                lost.add(pattern)
        return gained, lost

    def _bury(self, pattern: str, version: int) -> None:
        self.tombstones[pattern] = version
        self.tombstones.move_to_end(pattern)
        while len(self.tombstones) > self.max_tombstones:
            self.tombstones.popitem(last=False)

    def replace(self, version: int, buckets: dict[int, list[str]]) -> tuple[set[str], set[str]]:
        """Apply a SYNC_RESP: those buckets become exactly what the owner had at ``version``.

        Returns (added, removed) patterns. A bucket whose floor is already at or past ``version``
        (an answer overtaken by a newer one) is left alone."""
        added: set[str] = set()
        removed: set[str] = set()
        self.version = max(self.version, version)
        for index, patterns in buckets.items():
            if not 0 <= index < BUCKETS or self.floors[index] >= version:
                continue
            wanted = {p for p in patterns if bucket_of(p) == index}
            held = self._buckets.buckets[index]
            # An update newer than the answer (it crossed on the wire) stays.
            for pattern in held - wanted:
                if self.versions[pattern] <= version:
                    del self.versions[pattern]
                    self._buckets.discard(pattern)
                    removed.add(pattern)
            for pattern in wanted - held:
                if self.tombstones.get(pattern, 0) <= version:
                    self.tombstones.pop(pattern, None)
                    self.versions[pattern] = version
                    self._buckets.add(pattern)
                    added.add(pattern)
            self.floors[index] = version
        return added, removed

    def clear(self) -> set[str]:
        """Forget everything (the peer restarted: its versions start again)."""
        gone = set(self.versions)
        self.versions.clear()
        self.tombstones.clear()
        self.floors = [0] * BUCKETS
        self.version = 0
        self._buckets = _Buckets()
        return gone

    def leaves(self) -> list[bytes]:
        return self._buckets.leaves()

    def root(self) -> bytes:
        return self._buckets.root()
