"""Retained MQTT messages, mesh-wide: which copy of a topic's retained message wins, the bounds a node
holds them in, and how a record is written (the journal's line, the body of a ``$mqtt.`` event).

Every retained PUBLISH (and every clear: an empty payload) becomes a :class:`Record` stamped by the
node it was published on: ``at`` (milliseconds, that node's clock, never below the topic's last stamp
there + 1, so a later PUBLISH on one node always wins over an earlier one there) and ``origin`` (the
node's id). Of two records for a topic the one with the greater ``(at, origin, qos, payload)`` wins
(last writer wins, the node id breaking ties, and the rest making even equal stamps agree): the order
in which a node learns records does not change what it ends with (tests/unit/test_mqtt_retained_core.py).

A clear is kept as a *tombstone* (a record without payload) so that a stale copy learnt later loses
to it: for :data:`TOMBSTONE_TTL_MS`, at most :data:`MAX_TOMBSTONES` per node (each VPN its share, the
oldest dropped first). A record stamped more than :data:`MAX_SKEW_MS` ahead of this node's clock is
refused: a peer cannot make a copy win forever.

Pure: time is passed in, nothing here does I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from enum import Enum

import msgspec

from meshplane.core.mesh.vpn import vpn_of

MAX_RETAINED = 10_000  # topics with a retained message, per node
MAX_RETAINED_BYTES = 64 * 1024 * 1024
MAX_TOMBSTONES = 10_000  # clears remembered, per node
TOMBSTONE_TTL_MS = 24 * 3600 * 1000
MAX_SKEW_MS = 60_000  # how far ahead of this node's clock a record's stamp may be
MAX_ORIGIN = 255  # bytes of a node id


class Record(msgspec.Struct, array_like=True, frozen=True):
    """A topic's retained message (``payload`` empty: a clear) as stamped by its ``origin`` node."""

    subject: str  # internal: with its VPN's prefix, without ``$mqtt.``
    payload: bytes
    qos: int
    at: int  # milliseconds since the epoch, on the origin's clock
    origin: str

    def key(self) -> tuple[int, str, int, bytes]:
        return (self.at, self.origin, self.qos, self.payload)

    @property
    def size(self) -> int:
        """What the record costs its VPN's share (a tombstone costs a tombstone's place, not bytes)."""
        return len(self.payload) + len(self.subject) if self.payload else 0


class Body(msgspec.Struct, array_like=True, frozen=True):
    """A record as the body of a ``$mqtt.<subject>`` event (the subject is the event's)."""

    payload: bytes
    qos: int
    at: int
    origin: str


class Outcome(Enum):
    KEPT = "kept"  # the record is the topic's now
    STALE = "stale"  # the topic holds a newer one (or this one)
    FULL = "full"  # past its VPN's share: not kept
    INVALID = "invalid"  # a QoS, stamp or origin no node makes


_encode_json = msgspec.json.Encoder().encode
_decode_line = msgspec.json.Decoder(Record).decode
_encode_msgpack = msgspec.msgpack.Encoder().encode
_decode_body = msgspec.msgpack.Decoder(Body).decode


def encode_line(record: Record) -> bytes:
    """A record as a journal line (JSON, the payload in base64), newline included."""
    return _encode_json(record) + b"\n"


def decode_line(line: bytes) -> Record | None:
    """A journal line's record; None for a torn or unreadable line."""
    try:
        return _decode_line(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def encode_body(record: Record) -> bytes:
    return _encode_msgpack(Body(record.payload, record.qos, record.at, record.origin))


def decode_body(subject: str, body: bytes) -> Record | None:
    """A ``$mqtt.`` event's record (``subject`` without the prefix); None if the body is not one."""
    try:
        got = _decode_body(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return Record(subject, got.payload, got.qos, got.at, got.origin)


class RetainedTable:
    """A node's retained messages and tombstones, each VPN in its share of the node's bounds (the
    bounds divided by ``shares``, the node's VPNs, passed in at each offer so a reload changes them).

    Invariants: per VPN, live records <= ``max_count // shares`` and their sizes <=
    ``max_bytes // shares`` as of the offer that added them, tombstones <= ``max_tombstones // shares``;
    :attr:`bytes_of` and :attr:`live_of` are the sums of what :attr:`by_vpn` holds."""

    def __init__(
        self,
        max_count: int = MAX_RETAINED,
        max_bytes: int = MAX_RETAINED_BYTES,
        max_tombstones: int = MAX_TOMBSTONES,
        tombstone_ttl_ms: int = TOMBSTONE_TTL_MS,
    ) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self.max_tombstones, self.tombstone_ttl_ms = max_tombstones, tombstone_ttl_ms
        self.by_vpn: dict[str, dict[str, Record]] = {}  # VPN -> subject -> its record (or tombstone)
        self.tombstones: dict[str, dict[str, None]] = {}  # VPN -> subjects cleared, oldest first
        self.bytes_of: Counter[str] = Counter()  # VPN -> bytes of its live records
        self.live_of: Counter[str] = Counter()  # VPN -> its live records

    @property
    def count(self) -> int:
        return self.live_of.total()

    @property
    def entries(self) -> int:
        """Records held, tombstones included."""
        return sum(len(records) for records in self.by_vpn.values())

    def stamp(self, subject: str, now_ms: int) -> int:
        """The ``at`` of a record this node makes now: after the topic's last, whatever the clock did."""
        last = self.by_vpn.get(vpn_of(subject), {}).get(subject)
        return now_ms if last is None else max(now_ms, last.at + 1)

    def offer(self, record: Record, now_ms: int, shares: int = 1) -> Outcome:
        """Keep ``record`` if it wins over the topic's and fits its VPN's share."""
        outcome = self.check(record, now_ms, shares)
        if outcome is Outcome.KEPT:
            self.apply(record, shares)
        return outcome

    def check(self, record: Record, now_ms: int, shares: int = 1) -> Outcome:
        """What :meth:`offer` would do, changing nothing (so a journal can write the record first)."""
        if record.qos not in (0, 1) or record.at > now_ms + MAX_SKEW_MS or record.at < 0:
            return Outcome.INVALID
        if not record.origin or len(record.origin.encode()) > MAX_ORIGIN or not record.subject:
            return Outcome.INVALID
        vpn = vpn_of(record.subject)
        records = self.by_vpn.get(vpn, {})
        old = records.get(record.subject)
        if old is not None and record.key() <= old.key():
            return Outcome.STALE
        if not record.payload and old is None and record.at < now_ms - self.tombstone_ttl_ms:
            return Outcome.STALE  # a clear older than any tombstone kept: nothing to win against
        shares = max(shares, 1)
        if record.payload:
            count = self.live_of[vpn] - (1 if old is not None and old.payload else 0)
            size = self.bytes_of[vpn] - (old.size if old is not None else 0)
            if count >= self.max_count // shares or size + record.size > self.max_bytes // shares:
                return Outcome.FULL
        elif self.max_tombstones // shares < 1:
            return Outcome.FULL
        return Outcome.KEPT

    def apply(self, record: Record, shares: int = 1) -> None:
        """Keep ``record`` (which :meth:`check` said wins and fits)."""
        vpn = vpn_of(record.subject)
        old = self.by_vpn.get(vpn, {}).get(record.subject)
        if old is not None:
            self._drop(vpn, old)
        self.by_vpn.setdefault(vpn, {})[record.subject] = record
        if record.payload:
            self.live_of[vpn] += 1
            self.bytes_of[vpn] += record.size
        else:
            cleared = self.tombstones.setdefault(vpn, {})
            cleared[record.subject] = None
            while len(cleared) > max(self.max_tombstones // max(shares, 1), 1):
                self._drop(vpn, self.by_vpn[vpn][next(iter(cleared))])

    def _drop(self, vpn: str, record: Record) -> None:
        records = self.by_vpn[vpn]
        del records[record.subject]
        if record.payload:
            self.live_of[vpn] -= 1
            self.bytes_of[vpn] -= record.size
        else:
            del self.tombstones[vpn][record.subject]
            if not self.tombstones[vpn]:
                del self.tombstones[vpn]
        if not records:
            del self.by_vpn[vpn]

    def expire(self, now_ms: int) -> int:
        """Forget tombstones past their time; returns how many. Stops at the first one still due in
        each VPN (they are oldest first, as far as the clocks that stamped them agree)."""
        dropped = 0
        for vpn in list(self.tombstones):
            cleared = self.tombstones[vpn]
            while cleared:
                record = self.by_vpn[vpn][next(iter(cleared))]
                if record.at >= now_ms - self.tombstone_ttl_ms:
                    break
                self._drop(vpn, record)
                dropped += 1
                if vpn not in self.tombstones:
                    break
        return dropped

    def live(self, vpn: str) -> list[Record]:
        """A VPN's retained messages (no tombstones)."""
        return [record for record in self.by_vpn.get(vpn, {}).values() if record.payload]

    def records(self) -> Iterator[Record]:
        """Everything held, tombstones included: what a journal's compaction and a catch-up carry."""
        for records in self.by_vpn.values():
            yield from records.values()
