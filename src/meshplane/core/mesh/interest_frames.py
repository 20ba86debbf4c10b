"""The interest frames routes and gateways both take, checked alike (sans I/O): a SUB_ADD or
SUB_REMOVE's pattern, a SYNC_REQ's answer (a ping's, or the buckets a digest asks for), a SYNC_RESP's
buckets. Each check returns what to apply, or a :class:`Refusal`: a bad frame is counted, a protocol
break (a version from the future, more patterns than allowed) closes the connection."""

from __future__ import annotations

from dataclasses import dataclass

from meshplane.core.mesh.frames import (
    Frame,
    FrameType,
    SyncResponse,
    decode_sync,
    encode_frame,
    encode_payload,
)
from meshplane.core.mesh.interest import OwnInterest, decode_leaves, version_ceiling
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
