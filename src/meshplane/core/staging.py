"""Staged writes: what a writer's task attempt sends ahead of a commit, decided without I/O.

A Spark task attempt sends its rows in numbered chunks to a *stage* (an id it made up, one per
attempt and topic); the driver's commit names the stages of the attempts Spark committed, with the
chunks and events each reported, and only then are their events appended, under one idempotency
key per (query, batch). What a stage holds is decided here: a chunk is taken only as the next one
(a repeated chunk is answered again and taken once, a gap refused), the table is bounded in stages
and bytes, and a stage nobody wrote to for ``ttl`` seconds (its attempt died) expires. A commit is
taken only when every stage named holds exactly what its attempt reported: a stage that lost its
tail (a crash before the chunk reached the disk) is refused, never committed short.

Pure: the caller passes the time and does the file work.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum


class StageError(Exception):
    """A request the table refuses; ``kind`` says why (the adapter maps it to a status)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "bad" (the request is wrong), "limit" (full), "missing" (stage gone or short)


class Chunk(Enum):
    TAKE = "take"  # the next chunk: store it
    REPEATED = "repeated"  # already stored (a retried request): store nothing, answer again


@dataclass
class Stage:
    topic: str
    chunks: int = 0
    events: int = 0
    bytes: int = 0
    touched: float = 0.0


@dataclass(frozen=True)
class Limits:
    max_stages: int = 10_000
    max_bytes: int = 1 << 30
    ttl: float = 3600.0


@dataclass(frozen=True)
class Reported:
    """What a committed attempt said it staged."""

    stage: str
    chunks: int
    events: int


class StagingTable:
    """The stages held, oldest touched first."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.stages: OrderedDict[str, Stage] = OrderedDict()
        self.bytes = 0

    def offer(self, stage: str, topic: str, seq: int, events: int, size: int) -> Chunk:
        """Decide about chunk ``seq`` of ``stage`` (``events`` events, ``size`` bytes); nothing changes
        until :meth:`taken` says it was stored."""
        if seq < 0 or events < 1 or size < 0:
            raise StageError("bad", "a chunk needs seq >= 0 and at least one event")
        held = self.stages.get(stage)
        if held is not None and held.topic != topic:
            raise StageError("bad", f"stage {stage!r} belongs to topic {held.topic!r}")
        done = 0 if held is None else held.chunks
        if seq < done:
            return Chunk.REPEATED
        if seq > done:
            raise StageError("bad", f"stage {stage!r} expects chunk {done} next, not {seq}")
        if held is None and len(self.stages) >= self.limits.max_stages:
            raise StageError("limit", f"{len(self.stages)} stages are held (the limit): commit or abort some")
        if self.bytes + size > self.limits.max_bytes:
            raise StageError(
                "limit", f"staged data would exceed {self.limits.max_bytes} bytes: commit or abort some"
            )
        return Chunk.TAKE

    def taken(self, stage: str, topic: str, events: int, size: int, now: float) -> None:
        """Chunk stored: count it."""
        held = self.stages.pop(stage, None) or Stage(topic)
        held.chunks += 1
        held.events += events
        held.bytes += size
        held.touched = now
        self.stages[stage] = held  # to the end: the most recently touched
        self.bytes += size

    def restored(self, stage: str, topic: str, chunks: int, events: int, size: int, now: float) -> None:
        """A stage found on disk at start: its clock starts again (a live attempt may still finish)."""
        self.stages[stage] = Stage(topic, chunks, events, size, now)
        self.bytes += size

    def check_commit(self, topic: str, reported: Sequence[Reported]) -> list[str]:
        """The stages to commit, in the order given; refused unless each holds what was reported."""
        seen: set[str] = set()
        for each in reported:
            if each.stage in seen:
                raise StageError("bad", f"stage {each.stage!r} named twice")
            seen.add(each.stage)
            held = self.stages.get(each.stage)
            if held is None or held.topic != topic:
                raise StageError(
                    "missing",
                    f"stage {each.stage!r} of topic {topic!r} is not held (expired, aborted or lost): "
                    "the batch must be written again",
                )
            if (held.chunks, held.events) != (each.chunks, each.events):
                raise StageError(
                    "missing",
                    f"stage {each.stage!r} holds {held.chunks} chunks / {held.events} events, its attempt "
                    f"reported {each.chunks} / {each.events}: the batch must be written again",
                )
        return [each.stage for each in reported]

    def drop(self, stages: Iterable[str], topic: str | None = None) -> list[str]:
        """Forget these stages (of ``topic`` only, when given); returns those that were held."""
        dropped = []
        for stage in stages:
            held = self.stages.get(stage)
            if held is not None and (topic is None or held.topic == topic):
                del self.stages[stage]
                self.bytes -= held.bytes
                dropped.append(stage)
        return dropped

    def expired(self, now: float) -> list[str]:
        """Stages untouched for ``ttl`` seconds (dead attempts); the caller drops them."""
        found = []
        for stage, held in self.stages.items():
            if held.touched > now - self.limits.ttl:
                break  # the rest were touched later
            found.append(stage)
        return found

    def of_topic(self, topic: str) -> list[str]:
        return [s for s, held in self.stages.items() if held.topic == topic]
