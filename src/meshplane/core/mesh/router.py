"""A node's routing table (seed 004's TopicRouter), sans I/O.

- Local subscriptions: literal patterns in a dict (O(1)), wildcard patterns in a
  :class:`~meshplane.core.subjects.PatternIndex`; the holders are whatever the adapter delivers to
  (a client connection, the pub/sub service).
- Remote interest: per peer, a Bloom filter (the fast "no") in front of one exact index of every
  peer's patterns (:mod:`.remote_index`: literals in a dict, wildcards in a ``PatternIndex``). A
  filter's false positive costs a match, counted per peer; never a send.
- Routes are cached per subject (as nats-server's sublist caches matches); a change of interest drops
  only the cached routes of the subjects its pattern matches (:mod:`.route_cache`), so a steady
  publisher pays one dict lookup per event whatever others subscribe meanwhile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from meshplane.core.mesh.bloom import BloomFilter, BloomShape, pattern_key, subject_keys
from meshplane.core.mesh.frames import InterestChange, SyncResponse
from meshplane.core.mesh.interest import OwnInterest, PeerInterest
from meshplane.core.mesh.remote_index import RemoteIndex, is_literal
from meshplane.core.mesh.route_cache import RouteCache
from meshplane.core.subjects import PatternIndex

H = TypeVar("H", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Route(Generic[H]):
    local: frozenset[H]
    peers: tuple[str, ...]


@dataclass(eq=False)
class _Peer:
    interest: PeerInterest
    bloom: BloomFilter
    removed_since_rebuild: int = 0


@dataclass
class RouterLimits:
    bloom_filter_capacity: int = 100_000
    bloom_filter_fpr: float = 0.01
    route_cache_subjects: int = 4096
    tombstones_per_peer: int = 100_000


@dataclass
class Router(Generic[H]):
    limits: RouterLimits = field(default_factory=RouterLimits)

    def __post_init__(self) -> None:
        self.shape = BloomShape(self.limits.bloom_filter_capacity, self.limits.bloom_filter_fpr)
        self.own = OwnInterest()
        self._literal: dict[str, set[H]] = {}
        self._wildcard: PatternIndex[H] = PatternIndex()
        self._held: dict[H, set[str]] = {}
        self.peers: dict[str, _Peer] = {}
        self._remote = RemoteIndex()
        self._cache: RouteCache[Route[H]] = RouteCache(self.limits.route_cache_subjects)
        self.bloom_false_positives: Counter[str] = Counter()

    # --- local subscriptions -------------------------------------------------------------------------

    def subscribe(self, holder: H, pattern: str) -> int | None:
        """``holder`` wants ``pattern``; the version to announce in a SUB_ADD when it is the first."""
        if not self._hold(holder, pattern):
            return None
        self._cache.invalidate((pattern,))
        return self.own.add(pattern)

    def unsubscribe(self, holder: H, pattern: str) -> int | None:
        """The version to announce in a SUB_REMOVE when ``holder`` was the pattern's last."""
        if not self._release(holder, pattern):
            return None
        self._cache.invalidate((pattern,))
        return self.own.remove(pattern)

    def change_holdings(
        self, holder: H, changes: Iterable[tuple[bool, str]]
    ) -> tuple[list[str], list[str], list[tuple[bool, str, int]]]:
        """Many :meth:`subscribe` (True) and :meth:`unsubscribe` of one holder, in order, with the routes
        they touch dropped once. Returns the patterns it now holds and no longer holds (a subscribe of
        one it held, or an unsubscribe of one it did not, left out) and the SUB_ADD (True) /
        SUB_REMOVE to announce, in order."""
        gained: list[str] = []
        lost: list[str] = []
        announce: list[tuple[bool, str, int]] = []
        own = self.own
        for added, pattern in changes:
            if added:
                if not self._hold(holder, pattern):
                    continue
                gained.append(pattern)
                version = own.add(pattern)
            else:
                if not self._release(holder, pattern):
                    continue
                lost.append(pattern)
                version = own.remove(pattern)
            if version is not None:
                announce.append((added, pattern, version))
        if gained or lost:
            self._cache.invalidate(gained + lost)
        return gained, lost, announce

    def _hold(self, holder: H, pattern: str) -> bool:
        held = self._held.setdefault(holder, set())
        if pattern in held:
            return False
        held.add(pattern)
        if is_literal(pattern):
            self._literal.setdefault(pattern, set()).add(holder)
        else:
            self._wildcard.insert(pattern, holder)
        return True

    def _release(self, holder: H, pattern: str) -> bool:
        held = self._held.get(holder)
        if held is None or pattern not in held:
            return False
        held.discard(pattern)
        if not held:
            del self._held[holder]
        if is_literal(pattern):
            holders = self._literal[pattern]
            holders.discard(holder)
            if not holders:
                del self._literal[pattern]
        else:
            self._wildcard.remove(pattern, holder)
        return True

    def holds(self, holder: H, pattern: str) -> bool:
        held = self._held.get(holder)
        return held is not None and pattern in held

    def patterns_of(self, holder: H) -> set[str]:
        return set(self._held.get(holder, ()))

    def count_of(self, holder: H) -> int:
        """How many patterns ``holder`` holds, without a copy of them (checked at each SUB_ADD)."""
        return len(self._held.get(holder, ()))

    def holdings(self) -> list[tuple[H, str]]:
        """Every (holder, pattern) held here."""
        return [(holder, pattern) for holder, held in self._held.items() for pattern in held]

    @property
    def local_subscriptions(self) -> int:
        return sum(len(p) for p in self._held.values())

    # --- peers ---------------------------------------------------------------------------------------

    def add_peer(self, peer: str) -> set[str]:
        """A peer whose interest is to be learnt afresh (a new link: its copy starts empty); returns
        the patterns it had."""
        removed = self.remove_peer(peer)
        self.peers[peer] = _Peer(PeerInterest(self.limits.tombstones_per_peer), BloomFilter(self.shape))
        return removed

    def remove_peer(self, peer: str) -> set[str]:
        state = self.peers.pop(peer, None)
        if state is None:
            return set()
        removed = state.interest.clear()
        for pattern in removed:
            self._remote.remove(pattern, peer)
        self._cache.invalidate(removed)
        return removed

    def apply(self, peer: str, pattern: str, version: int, added: bool) -> bool:
        """A peer's SUB_ADD / SUB_REMOVE; True when it changed what is routed there."""
        state = self.peers.get(peer)
        if state is None or not state.interest.apply(pattern, version, added):
            return False
        if added:
            self._remote.insert(pattern, peer)
            state.bloom.add(self.shape.positions(pattern_key(pattern)))
        else:
            self._remote.remove(pattern, peer)
            self._removed(state)
        self._cache.invalidate((pattern,))
        return True

    def apply_many(self, peer: str, changes: Iterable[InterestChange]) -> tuple[set[str], set[str]]:
        """A peer's INTEREST frame: :meth:`apply` of each change in order, the routes they touch
        dropped once. Returns the patterns now routed there (gained) and no longer (lost), net of each
        other (one added, then removed, is neither)."""
        state = self.peers.get(peer)
        if state is None:
            return set(), set()
        gained, lost = state.interest.apply_many(changes)
        remote, bloom, positions = self._remote, state.bloom, self.shape.positions
        for pattern in gained:
            remote.insert(pattern, peer)
            bloom.add(positions(pattern_key(pattern)))
        for pattern in lost:
            remote.remove(pattern, peer)
        if lost:
            self._removed(state, len(lost))
        if gained or lost:
            self._cache.invalidate(gained | lost)
        return gained, lost

    def apply_sync(self, peer: str, response: SyncResponse) -> tuple[set[str], set[str]]:
        state = self.peers.get(peer)
        if state is None:
            return set(), set()
        added, removed = state.interest.replace(response.version, response.buckets)
        for pattern in added:
            self._remote.insert(pattern, peer)
            state.bloom.add(self.shape.positions(pattern_key(pattern)))
        for pattern in removed:
            self._remote.remove(pattern, peer)
        if removed:
            self._removed(state, len(removed))
        if added or removed:
            self._cache.invalidate(added | removed)
        return added, removed

    def _removed(self, state: _Peer, count: int = 1) -> None:
        """Filters cannot forget a key: rebuild one once removals outnumber what it holds."""
        state.removed_since_rebuild += count
        if state.removed_since_rebuild > max(16, len(state.interest.versions)):
            state.bloom.clear()
            for pattern in state.interest.versions:
                state.bloom.add(self.shape.positions(pattern_key(pattern)))
            state.removed_since_rebuild = 0

    @property
    def remote_subscriptions(self) -> int:
        return sum(len(p.interest.versions) for p in self.peers.values())

    # --- routing -------------------------------------------------------------------------------------

    @property
    def changes(self) -> int:
        """Grows with every change of interest: a route copied before one may be stale."""
        return self._cache.changes

    def route(self, subject: str) -> Route[H]:
        cached = self._cache.get(subject)
        if cached is not None:
            return cached
        local = set(self._literal.get(subject, ()))
        if self._wildcard.patterns:
            local |= self._wildcard.match(subject)
        peers: tuple[str, ...] = ()
        if self.peers:
            probes = [self.shape.positions(key) for key in subject_keys(subject)]
            maybe = [
                peer for peer, state in self.peers.items() if any(state.bloom.may_contain(p) for p in probes)
            ]
            if maybe:
                interested = self._remote.match(subject)
                peers = tuple(peer for peer in maybe if peer in interested)
                for peer in maybe:
                    if peer not in interested:
                        self.bloom_false_positives[peer] += 1
        route = Route(frozenset(local), peers)
        self._cache.put(subject, route)
        return route

    @property
    def topics_active(self) -> int:
        """Patterns with a subscriber here or at a peer."""
        return len(set(self.own.holders) | {p for s in self.peers.values() for p in s.interest.versions})
