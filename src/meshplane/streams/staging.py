"""Staged writes on disk: one record file per stage under ``<data dir>/staging``.

The decisions are :mod:`meshplane.core.staging`'s; this module does the files. A chunk is one record
(``[topic, seq, [[partition or nil, event], ...]]``, the partition log's record format): written with
one ``write()`` and undone whole if it fails (a full disk answers 507 and stages nothing), a torn
tail cut when the file is read. Stage files are not fsynced: a stage that lost chunks in a machine
crash no longer matches what its attempt reported, and its commit is refused (the writer runs the
batch again), never made short.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from meshplane.core.staging import Chunk, Limits, Reported, StageError, StagingTable
from meshplane.core.streamlog import StoredEvent
from meshplane.streams.errors import BadRequest, Conflict, LimitReached, storage_error
from meshplane.streams.files import RecordFile

log = logging.getLogger(__name__)
T = TypeVar("T")

STAGE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
Placed = tuple[int | None, StoredEvent]  # an event and the partition its row named, if any


class _Chunk(msgspec.Struct, array_like=True):
    topic: str
    seq: int
    events: list[tuple[int | None, StoredEvent]]


_DECODER = msgspec.msgpack.Decoder(_Chunk)
_ENCODER = msgspec.msgpack.Encoder()


def check_stage_id(stage: object) -> str:
    if not isinstance(stage, str) or not STAGE_ID.fullmatch(stage):
        raise BadRequest(f"invalid stage id {str(stage)[:80]!r}: use 1-64 of A-Z a-z 0-9 _ -")
    return stage


class StagingStore:
    """The stages of this server: bounded (count, bytes), expiring, kept across restarts."""

    def __init__(self, directory: Path, limits: Limits) -> None:
        self.directory = directory
        self.table = StagingTable(limits)
        self.expired_total = 0

    def open(self, now: float) -> None:
        """Take back the stages found on disk (a restart between a task's write and its commit)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.glob("*.stage")):
            try:
                chunks = [_DECODER.decode(p) for p in RecordFile(path).load()]
            except (msgspec.DecodeError, msgspec.ValidationError, OSError) as exc:
                log.warning("%s: unreadable (%s); dropped", path, exc)
                path.unlink(missing_ok=True)
                continue
            if not chunks or [c.seq for c in chunks] != list(range(len(chunks))):
                path.unlink(missing_ok=True)
                continue
            events = sum(len(c.events) for c in chunks)
            self.table.restored(path.stem, chunks[0].topic, len(chunks), events, path.stat().st_size, now)

    def _path(self, stage: str) -> Path:
        return self.directory / f"{stage}.stage"

    def stage(self, topic: str, stage: str, seq: int, events: list[Placed], now: float) -> bool:
        """Store chunk ``seq``; False when it was already stored (a retried request)."""
        check_stage_id(stage)
        payload = _ENCODER.encode(_Chunk(topic, seq, events))
        decision = _decided(lambda: self.table.offer(stage, topic, seq, len(events), len(payload), now))
        if decision is Chunk.REPEATED:
            return False
        record = RecordFile(self._path(stage))
        try:
            record.load()  # its size and count: the append goes after the last whole record
            record.append(payload)
        except OSError as exc:
            raise storage_error(exc, f"staging chunk {seq} of stage {stage}") from exc
        finally:
            record.close()
        self.table.taken(stage, topic, len(events), len(payload), now)
        return True

    def take(self, topic: str, reported: list[Reported]) -> list[Placed]:
        """The events of these stages, in order, once each is checked to hold what was reported."""
        stages = _decided(lambda: self.table.check_commit(topic, reported))
        events: list[Placed] = []
        for stage in stages:
            try:
                events.extend(e for chunk in self._chunks(stage) for e in chunk.events)
            except (msgspec.DecodeError, msgspec.ValidationError, OSError) as exc:
                self.drop([stage])
                raise Conflict(f"stage {stage!r} cannot be read ({exc}): write the batch again") from None
        return events

    def _chunks(self, stage: str) -> list[_Chunk]:
        record = RecordFile(self._path(stage))
        chunks = [_DECODER.decode(p) for p in record.load()]
        record.close()
        held = self.table.stages[stage]
        if len(chunks) != held.chunks:  # the file lost its tail under us
            raise OSError(f"{len(chunks)} of {held.chunks} chunks on disk")
        return chunks

    def drop(self, stages: list[str], topic: str | None = None) -> int:
        dropped = self.table.drop(stages, topic)
        for stage in dropped:
            try:
                self._path(stage).unlink(missing_ok=True)
            except OSError as exc:  # forgotten anyway; the file goes at the next start
                log.warning("staging: cannot remove %s: %s", self._path(stage), exc)
        return len(dropped)

    def expire(self, now: float) -> None:
        dead = self.table.expired(now)
        if dead:
            self.expired_total += self.drop(dead)
            log.info("staging: %d stages of attempts that never committed expired", len(dead))


def _decided(decide: Callable[[], T]) -> T:
    try:
        return decide()
    except StageError as exc:
        if exc.kind == "limit":
            raise LimitReached(str(exc)) from None
        if exc.kind == "missing":
            raise Conflict(str(exc)) from None
        raise BadRequest(str(exc)) from None
