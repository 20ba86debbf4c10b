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
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec

from meshplane.core.staging import Chunk, Limits, Reported, StageError, StagingTable
from meshplane.core.streamlog import StoredEvent
from meshplane.streams.errors import BadRequest, Conflict, LimitReached, storage_error
from meshplane.streams.files import RecordFile

if TYPE_CHECKING:
    from meshplane.streams.config import StreamsConfig
    from meshplane.streams.service import StreamsService

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

    @classmethod
    def of(cls, root: Path, config: StreamsConfig) -> StagingStore:
        """The store under ``<data dir>/staging`` with the configured bounds."""
        limits = Limits(config.staging_max_stages, config.staging_max_bytes, config.staging_ttl_secs)
        return cls(root / "staging", limits)

    def use(self) -> dict[str, tuple[int, int]]:
        """Its bounded resources: (in use, limit), for ``GET /storage`` and the metrics."""
        limits = self.table.limits
        return {
            "staged_writes": (len(self.table.stages), limits.max_stages),
            "staged_bytes": (self.table.bytes, limits.max_bytes),
        }

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
        decision = _decided(lambda: self.table.offer(stage, topic, seq, len(events), len(payload)))
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
            raise LimitReached(str(exc), "staging") from None
        if exc.kind == "missing":
            raise Conflict(str(exc)) from None
        raise BadRequest(str(exc)) from None


class StagedWrites:
    """The streams service's staged-write methods (a writer's commit protocol), mixed into it."""

    def _service(self) -> StreamsService:
        return cast("StreamsService", self)

    def stage(self, name: str, stage: str, seq: int, events: list[Placed]) -> bool:
        """Keep chunk ``seq`` of a task attempt's rows until its commit; False: already kept."""
        service = self._service()
        service.topic(name)  # a missing topic: 404 now, not at the commit
        return service.staging.stage(name, stage, seq, events, time.time())

    async def commit_staged(self, name: str, key: str, reported: list[Reported]) -> tuple[bool, int]:
        """Append the events of exactly these stages, once per ``key``: (appended now, events). A key
        already answered appends nothing (a batch committed before); the stages are dropped either way."""
        if not 1 <= len(key) <= 256:
            raise BadRequest("idempotency_key must be 1..256 characters")
        service, stages = self._service(), [r.stage for r in reported]
        if service.idempotency.get(f"{name}/{service.topic(name).settings.incarnation}/{key}") is not None:
            service.staging.drop(stages, name)
            service.counters["duplicates_skipped"] += sum(r.events for r in reported)
            return False, 0
        placed = service.staging.take(name, reported)
        if placed:
            await self._append_staged(name, placed, key)
        service.staging.drop(stages, name)
        return True, len(placed)

    async def _append_staged(self, name: str, placed: list[Placed], key: str) -> None:
        """One append (all-or-nothing across the topic's partitions) under ``key``."""
        service, events = self._service(), [e for _, e in placed]
        result, synced = service.append_topic(name, events, None, key, [p for p, _ in placed])
        if synced:
            await service.durability.written(*synced, records=len(result))

    def abort_staged(self, name: str, stages: list[str]) -> int:
        return self._service().staging.drop(stages, name)


Publish = Callable[[str, list[StoredEvent], int | None, str | None], Awaitable[Any]]


async def append_by_partition(publish: Publish, name: str, placed: list[Placed], key: str) -> None:
    """Staged events appended by one publish per partition the rows named (and one for the rest),
    each under its own key: where a multi-partition append is not all-or-nothing (JetStream), a
    failure part-way is completed, without duplicates, by the writer running the batch again."""
    by_partition: dict[int | None, list[StoredEvent]] = {}
    for partition, event in placed:
        by_partition.setdefault(partition, []).append(event)
    for partition, events in by_partition.items():
        await publish(name, events, partition, key if partition is None else f"{key}@{partition}")
