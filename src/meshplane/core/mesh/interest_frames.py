"""The interest frames routes and gateways both take, checked alike (sans I/O): a SUB_ADD or
SUB_REMOVE's pattern, an INTEREST frame's changes (many of those in one, between routes), a SYNC_REQ's
answer (a ping's, or the buckets a digest asks for), a SYNC_RESP's
buckets. Each check returns what to apply, or a :class:`Refusal`: a bad frame is counted, a protocol
break (a version from the future, more patterns than allowed) closes the connection."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from meshplane.core.mesh.frames import (
    INTEREST_CHANGES_PER_FRAME,
    Frame,
    FrameType,
    InterestChange,
    SyncResponse,
    decode_interest,
    decode_sync,
    encode_frame,
    encode_payload,
)
from meshplane.core.mesh.interest import VERSION_SLACK, OwnInterest, decode_leaves, version_ceiling
from meshplane.core.subjects import valid_pattern


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    close: bool  # a protocol break: the connection is closed (else the frame is counted and dropped)


@dataclass(frozen=True, slots=True)
class Known:
    """What this end knows of the peer's interest: its version, how many patterns, the peer's epoch
    (the ceiling of believable versions) and the most patterns it may hold."""

    version: int
    patterns: int
    epoch: int
    max_patterns: int


def interest_change(frame: Frame, known: Known, now_ns: int) -> str | Refusal:
    """A SUB_ADD's or SUB_REMOVE's pattern, or why it is refused."""
    pattern = valid_pattern(frame.subject)
    if pattern is None:
        return Refusal("bad_pattern", close=False)
    if frame.sequence > version_ceiling(known.version, known.epoch, now_ns):
        return Refusal("version_jump", close=True)
    if frame.type is FrameType.SUB_ADD and known.patterns >= known.max_patterns:
        return Refusal("pattern_limit", close=True)
    return pattern


@dataclass(frozen=True, slots=True)
class Changes:
    """An INTEREST frame's changes to apply, in order, and how many were left out (a bad pattern)."""

    changes: list[InterestChange]
    bad: int


def interest_batch(payload: bytes, known: Known, held: Container[str], now_ns: int) -> Changes | Refusal:
    """An INTEREST frame's changes, each checked as :func:`interest_change` checks one frame's (the
    version against the highest seen so far, in the frame too), or why the frame is refused. ``held``:
    the patterns the peer holds, so the pattern limit counts what each change would really hold."""
    try:
        changes = decode_interest(payload)
    except ValueError:
        return Refusal("bad_interest", close=False)
    if len(changes) > INTEREST_CHANGES_PER_FRAME:
        return Refusal("interest_batch", close=True)
    version, patterns = known.version, known.patterns
    ceiling = version_ceiling(version, known.epoch, now_ns)
    present: dict[str, bool] = {}  # patterns this frame changed: held after it so far?
    checked: list[InterestChange] = []
    bad = 0
    for change in changes:
        pattern = change.pattern
        if valid_pattern(pattern) is None:
            bad += 1
            continue
        if change.version > ceiling:
            return Refusal("version_jump", close=True)
        if change.version > version:
            version, ceiling = change.version, change.version + VERSION_SLACK
        holds = present.get(pattern)
        if holds is None:
            holds = pattern in held
        if change.added and not holds:
            if patterns >= known.max_patterns:
                return Refusal("pattern_limit", close=True)
            patterns += 1
        elif not change.added and holds:
            patterns -= 1
        present[pattern] = change.added
        checked.append(change)
    return Changes(checked, bad)


class InterestBatch:
    """The changes of one INTEREST frame being filled (a connection's ``send_batched``)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.changes: list[InterestChange] = []

    @property
    def full(self) -> bool:
        return len(self.changes) >= INTEREST_CHANGES_PER_FRAME

    def add(self, change: InterestChange) -> None:
        self.changes.append(change)

    def encode(self) -> bytes:
        return encode_frame(FrameType.INTEREST, self.source, payload=encode_payload(self.changes))


def sync_reply(frame: Frame, node_id: str, own: OwnInterest) -> bytes | Refusal:
    """The SYNC_RESP to a SYNC_REQ: to a ping (no digest) an empty one with its sequence, to a digest
    the whole content of every bucket that differs."""
    if not frame.payload:
        return encode_frame(FrameType.SYNC_RESP, node_id, sequence=frame.sequence)
    try:
        leaves = decode_leaves(frame.payload)
    except ValueError:
        return Refusal("bad_digest", close=False)
    answer = SyncResponse(own.version, own.answer(leaves))
    return encode_frame(FrameType.SYNC_RESP, node_id, sequence=answer.version, payload=encode_payload(answer))


def sync_answer(payload: bytes, known: Known, now_ns: int) -> SyncResponse | Refusal:
    """A SYNC_RESP's buckets, their invalid patterns left out; or why the answer is refused."""
    try:
        answer = decode_sync(payload)
    except ValueError:
        return Refusal("bad_sync", close=False)
    if answer.version > version_ceiling(known.version, known.epoch, now_ns):
        return Refusal("version_jump", close=True)
    if sum(len(bucket) for bucket in answer.buckets.values()) > known.max_patterns:
        return Refusal("pattern_limit", close=True)
    buckets = {
        i: [p for p in patterns if valid_pattern(p) is not None] for i, patterns in answer.buckets.items()
    }
    return SyncResponse(answer.version, buckets)
