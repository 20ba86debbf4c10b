"""Who must hold a write before the active HA mate acknowledges it, sans I/O.

The active mirrors its data directory to one standby at a time and names in etcd's ``current`` the
mates that hold every acknowledged write; a mate takes over only if ``current`` names it. Kafka's
in-sync-replica rule is the anchor: a follower joins the in-sync set only once caught up, and leaves
it (in the durable record) before the leader commits anything without it.

**Invariant**: at every moment, every mate that etcd's ``current`` may name has applied every
acknowledged write. Hence an acknowledgement is answered only when every mate ``current`` may name
has applied it, or ``current`` names the active alone before the acknowledgement; and a standby is
added to ``current`` only once it has applied every write acknowledged so far.

"May name" is what makes it hold across etcd writes in flight: while a write is outstanding, etcd
holds either the old value or the new one; a write that failed (a timeout) may have been applied
or not, so both values stay possible until a later write succeeds. A standby connection is known
by its **generation**: an answer from an older connection of the same mate counts for nothing, and a
connection that closes takes its mate out of the set the next acknowledgement may rely on.

Inputs (methods) return nothing; the decisions are queued as actions (:meth:`actions`) for the
adapter (``meshplane.mesh.mates.MirrorServer``) to carry out:

- :class:`StartSnapshot` a new connection gets a snapshot (only while ``current`` cannot name any
  standby: the snapshot empties the standby's copy first);
- :class:`SendRound` the changes since the last round and a barrier numbered ``number``; at most one
  round in flight;
- :class:`WriteCurrent` etcd's ``current`` set to ``tokens``; at most one write in flight;
- :class:`Answer` / :class:`Fail` a waiting acknowledgement (a ticket) is answered or failed (the
  lease was lost: whether the write survives is unknown).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StartSnapshot:
    gen: int


@dataclass(frozen=True, slots=True)
class SendRound:
    gen: int
    number: int


@dataclass(frozen=True, slots=True)
class WriteCurrent:
    tokens: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    ticket: int


@dataclass(frozen=True, slots=True)
class Fail:
    ticket: int
    reason: str


Action = StartSnapshot | SendRound | WriteCurrent | Answer | Fail


@dataclass(slots=True)
class _Connection:
    gen: int
    token: str
    snapshot: bool = False  # its snapshot was started
    live: bool = False  # the snapshot is sent: rounds go to it, and acknowledgements wait for it
    caught_up: bool = False  # it answered a round sent after its snapshot


@dataclass(frozen=True, slots=True)
class _Round:
    gen: int
    number: int
    covers: int  # every ticket up to this one was requested before the round's changes were taken


class MirrorMembership:
    """The active's view: the standby connection, the rounds, etcd's ``current``, the tickets."""

    def __init__(self, active: str) -> None:
        self.active = active
        # What etcd's ``current`` may hold: the active wrote itself alone when it took the lease.
        self._possible: set[tuple[str, ...]] = {(active,)}
        self._writing: tuple[str, ...] | None = None
        self._conn: _Connection | None = None
        self._gens = 0
        self._round: _Round | None = None
        self._rounds = 0
        self._tickets = 0
        self._waiting: deque[int] = deque()  # tickets in order
        self._acked = 0  # the highest ticket answered (tickets are answered in order)
        # Per mate token: every ticket up to this one is applied in its copy (since its last reset).
        self._applied: dict[str, int] = {}
        self._lost = ""
        self._out: list[Action] = []

    # --- inputs ----------------------------------------------------------------------------------------

    def request(self) -> int:
        """A write was made and waits to be acknowledged: its ticket (answered by Answer or Fail)."""
        self._tickets += 1
        self._waiting.append(self._tickets)
        self._advance()
        return self._tickets

    def connected(self, token: str) -> int:
        """A standby named ``token`` connected (replacing any other): its generation."""
        if self._conn is not None:
            self.closed(self._conn.gen)
        self._gens += 1
        self._conn = _Connection(self._gens, token)
        self._advance()
        return self._gens

    def closed(self, gen: int) -> None:
        """The connection of generation ``gen`` closed or was dropped (no answer in time)."""
        if self._conn is not None and self._conn.gen == gen:
            self._conn = None
        if self._round is not None and self._round.gen == gen:
            self._round = None
        self._advance()

    def snapshot_sent(self, gen: int) -> None:
        """The snapshot is all sent to ``gen``: the next round brings it up to date."""
        if self._conn is not None and self._conn.gen == gen:
            self._conn.live = True
        self._advance()

    def answered(self, gen: int, number: int) -> None:
        """The standby of ``gen`` answered the barrier ``number``: it applied every change before it."""
        done = self._round
        if done is None or done.gen != gen or done.number != number:
            return  # an older connection's, or an answer to nothing: counts for nothing
        self._round = None
        if self._conn is not None and self._conn.gen == gen:
            token = self._conn.token
            self._applied[token] = max(self._applied.get(token, 0), done.covers)
            self._conn.caught_up = True
        self._advance()

    def written(self, ok: bool) -> None:
        """The write of ``current`` returned: ``ok``, or failed with an unknown outcome (etcd may have
        applied it: both values stay possible until a later write succeeds)."""
        if self._writing is None:
            return
        if ok:
            self._possible = {self._writing}
        self._writing = None
        self._advance()

    def lease_lost(self, why: str = "this HA mate lost its lease") -> None:
        """Nothing more is acknowledged: each waiting ticket fails (its write's fate is unknown)."""
        self._lost = self._lost or why
        self._advance()

    # --- what the adapter reads ------------------------------------------------------------------------

    def actions(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    @property
    def lost(self) -> bool:
        return bool(self._lost)

    def named(self) -> set[str]:
        """The standbys etcd's ``current`` may name now."""
        return {token for value in self._possible for token in value if token != self.active}

    def state(self) -> str:
        """absent, syncing (snapshot), catching_up, or in_sync (etcd names the connected standby)."""
        conn = self._conn
        if conn is None:
            return "absent"
        if not conn.live:
            return "syncing"
        return "in_sync" if self._possible == {(self.active, conn.token)} else "catching_up"

    @property
    def standby(self) -> str:
        return self._conn.token if self._conn is not None else ""

    # --- decisions -------------------------------------------------------------------------------------

    def _relied_on(self) -> set[str]:
        """The mates a ticket must be applied on before it is answered: every one ``current`` may
        name, and the standby catching up (so it has all that was answered once it joins)."""
        mates = self.named()
        if self._conn is not None and self._conn.live:
            mates.add(self._conn.token)
        return mates

    def _advance(self) -> None:
        if self._lost:
            for ticket in self._waiting:
                self._out.append(Fail(ticket, self._lost))
            self._waiting.clear()
            return
        relied = self._relied_on()
        while self._waiting and all(self._applied.get(m, 0) >= self._waiting[0] for m in relied):
            self._acked = self._waiting.popleft()
            self._out.append(Answer(self._acked))
        conn, named = self._conn, self.named()
        # Only what a named or connected mate applied matters (bounded by them, not by all ever seen).
        self._applied = {t: n for t, n in self._applied.items() if t in named or (conn and t == conn.token)}
        if self._writing is None:
            if any(conn is None or not conn.live or token != conn.token for token in named):
                self._write((self.active,))  # a named mate left (or is starting over): out first
            elif (
                conn is not None
                and conn.live
                and conn.caught_up
                and self._possible != {(self.active, conn.token)}
                and self._applied.get(conn.token, 0) >= self._acked
            ):
                self._write((self.active, conn.token))  # caught up: it joins (again, if unsure it did)
        if conn is not None and not conn.snapshot and not named:
            conn.snapshot = True
            self._applied.pop(conn.token, None)  # the snapshot empties its copy first
            self._out.append(StartSnapshot(conn.gen))
        if conn is not None and conn.live and self._round is None and self._round_wanted(conn):
            self._rounds += 1
            self._round = _Round(conn.gen, self._rounds, self._tickets)
            self._out.append(SendRound(conn.gen, self._rounds))

    def _round_wanted(self, conn: _Connection) -> bool:
        """A round is due: to catch the new standby up, or for a ticket it has not applied yet."""
        if not conn.caught_up:
            return True
        applied = self._applied.get(conn.token, 0)
        return bool(self._waiting) and self._waiting[-1] > applied

    def _write(self, tokens: tuple[str, ...]) -> None:
        self._writing = tokens
        self._possible.add(tokens)
        self._out.append(WriteCurrent(tokens))
