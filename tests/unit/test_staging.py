"""Staged writes (the Spark sink's commit protocol): the pure table, and the service's stages on disk
through restarts, full disks and failing writes."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.staging import Chunk, Limits, Reported, StageError, StagingTable
from meshplane.core.streamlog import EVENT_DECODER, StoredEvent
from meshplane.streams.errors import BadRequest, Conflict, LimitReached, StorageError
from meshplane.streams.service import StreamsConfig, StreamsService
from tests.faults import FaultInjector, crash

# --- the pure table -------------------------------------------------------------------------------

offers = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(0, 4), st.integers(1, 5), st.integers(0, 400)), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(offers, st.integers(1, 3), st.integers(100, 2000))
def test_a_stage_takes_each_chunk_once_in_order_within_its_bounds(
    steps: list[tuple[str, int, int, int]], max_stages: int, max_bytes: int
) -> None:
    table = StagingTable(Limits(max_stages=max_stages, max_bytes=max_bytes, ttl=10.0))
    model: dict[str, list[int]] = {}  # stage -> [chunks, events, bytes]
    for now, (stage, seq, events, size) in enumerate(steps):
        done = model.get(stage, [0, 0, 0])[0]
        refused: StageError | None = None
        try:
            decision = table.offer(stage, "t", seq, events, size)
        except StageError as exc:
            refused = exc
        if refused is not None:
            full = (len(model) >= max_stages and stage not in model) or table.bytes + size > max_bytes
            assert (seq > done) if refused.kind == "bad" else (refused.kind == "limit" and full)
            continue
        if seq < done:
            assert decision is Chunk.REPEATED
            continue
        assert decision is Chunk.TAKE
        assert seq == done
        table.taken(stage, "t", events, size, float(now))
        held = model.setdefault(stage, [0, 0, 0])
        held[0], held[1], held[2] = held[0] + 1, held[1] + events, held[2] + size
        assert len(table.stages) <= max_stages
        assert table.bytes <= max_bytes
    assert table.bytes == sum(b for _, _, b in model.values())
    for stage, (chunks, events, _) in model.items():
        assert table.check_commit("t", [Reported(stage, chunks, events)]) == [stage]
        with pytest.raises(StageError):
            table.check_commit("t", [Reported(stage, chunks + 1, events)])  # short: never committed
        with pytest.raises(StageError):
            table.check_commit("other", [Reported(stage, chunks, events)])  # another topic's
    assert table.expired(len(steps) + 10.0) == list(table.stages)
    table.drop(list(model))
    assert table.bytes == 0
    assert not table.stages


def test_a_stage_belongs_to_one_topic_and_a_gap_is_refused() -> None:
    table = StagingTable()
    table.taken("s", "t", 1, 10, 0.0)
    with pytest.raises(StageError, match="belongs to topic 't'"):
        table.offer("s", "u", 1, 1, 10)
    with pytest.raises(StageError, match="expects chunk 1 next, not 2"):
        table.offer("s", "t", 2, 1, 10)
    with pytest.raises(StageError, match="named twice"):
        table.check_commit("t", [Reported("s", 1, 1), Reported("s", 1, 1)])


# --- the service ----------------------------------------------------------------------------------


def placed(first: int, count: int, partition: int | None = None) -> list[tuple[int | None, StoredEvent]]:
    return [
        (partition, StoredEvent(f"id{i}", "e", {"i": i}, f"k{i % 5}")) for i in range(first, first + count)
    ]


def stored(engine: StreamsService, topic: str = "t") -> list[int]:
    values = []
    for plog in engine.topic_store.get(topic).partitions:
        values += [r.payload for r in plog.read(plog.start_offset, 100_000, max_bytes=1 << 30)]
    return sorted(EVENT_DECODER.decode(v).data["i"] for v in values)


async def started(directory: Path, **config: object) -> StreamsService:
    engine = StreamsService(StreamsConfig(data_dir=directory, fsync="always", **config))  # type: ignore[arg-type]
    await engine.start()
    return engine


async def test_a_commit_appends_exactly_the_stages_named_once_and_survives_a_restart(tmp_path: Path) -> None:
    engine = await started(tmp_path)
    await engine.create_topic("t", 3)
    assert engine.stage("t", "a1", 0, placed(0, 4))
    assert not engine.stage("t", "a1", 0, placed(0, 4))  # a retried request: kept once
    assert engine.stage("t", "a1", 1, placed(4, 2, partition=2))
    assert engine.stage("t", "dead", 0, placed(100, 3))  # an attempt Spark did not commit
    assert engine.stage("t", "b1", 0, placed(6, 4))
    crash(engine)  # kill -9 between the tasks' writes and the driver's commit
    engine = await started(tmp_path)
    try:
        with pytest.raises(Conflict, match="holds 2 chunks / 6 events, its attempt reported 3 / 9"):
            await engine.commit_staged("t", "q:0", [Reported("a1", 3, 9)])
        reported = [Reported("a1", 2, 6), Reported("b1", 1, 4)]
        assert await engine.commit_staged("t", "q:0", reported) == (True, 10)
        assert stored(engine) == list(range(10))
        assert engine.topic_store.get("t").partitions[2].next_offset >= 2  # the rows' own partition
        assert not {"a1", "b1"} & set(engine.staging.table.stages)
    finally:
        crash(engine)
    engine = await started(tmp_path)
    try:  # the batch runs again after a driver crash: new stages, the same key: nothing appended
        engine.stage("t", "a2", 0, placed(0, 10))
        assert await engine.commit_staged("t", "q:0", [Reported("a2", 1, 10)]) == (False, 0)
        assert stored(engine) == list(range(10))
        assert "a2" not in engine.staging.table.stages
        assert engine.abort_staged("t", ["dead"]) == 1
        assert not engine.staging.table.stages
        assert not list((tmp_path / "staging").iterdir())
    finally:
        await engine.close()


async def test_stages_are_bounded_and_those_of_dead_attempts_expire(tmp_path: Path) -> None:
    engine = await started(tmp_path, staging_max_stages=2, staging_max_bytes=1 << 20, staging_ttl_secs=0.0)
    try:
        await engine.create_topic("t", 1)
        engine.stage("t", "a", 0, placed(0, 1))
        engine.stage("t", "b", 0, placed(1, 1))
        with pytest.raises(LimitReached, match="2 stages are held"):
            engine.stage("t", "c", 0, placed(2, 1))
        with pytest.raises(LimitReached, match="exceed 1048576 bytes"):
            engine.stage("t", "a", 1, [(None, StoredEvent("x", "e", "x" * (1 << 20)))])
        with pytest.raises(BadRequest, match="invalid stage id"):
            engine.stage("t", "../etc", 0, placed(0, 1))
        engine.maintain(0.0)
        assert not engine.staging.table.stages
        assert engine.staging.expired_total == 2
    finally:
        await engine.close()


async def staging_workload(engine: StreamsService, acked: dict[str, list[int]]) -> None:
    """Two batches, each two attempts' stages and a commit, each commit sent twice."""
    for batch in range(2):
        try:
            if "t" not in engine.topics:
                await engine.create_topic("t", 2, segment_bytes=4_096)
            for attempt in range(2):
                for seq in range(2):
                    engine.stage(
                        "t", f"s{batch}{attempt}", seq, placed(batch * 100 + attempt * 10 + seq * 5, 5)
                    )
            reported = [Reported(f"s{batch}{a}", 2, 10) for a in range(2)]
            for _ in range(2):
                await engine.commit_staged("t", f"q:{batch}", reported)
            acked[f"q:{batch}"] = [batch * 100 + a * 10 + i for a in range(2) for i in range(10)]
        except (StorageError, Conflict):
            continue


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=errno.errorcode.get)
async def test_a_failed_write_stages_nothing_and_a_crash_never_commits_short_or_twice(
    shm_path: Path, error: int
) -> None:
    with FaultInjector(shm_path / "dry").installed() as counter:
        engine = await started(shm_path / "dry")
        await staging_workload(engine, {})
        crash(engine)
    assert counter.count > 30
    for fail_at in range(1, counter.count + 1):
        directory = shm_path / f"{error}-{fail_at}"
        acked: dict[str, list[int]] = {}
        with FaultInjector(directory, fail_at, error).installed():
            try:
                engine = await started(directory)
            except StorageError:
                continue
            await staging_workload(engine, acked)
            crash(engine)
        engine = await started(directory)
        try:
            expected = sorted(i for values in acked.values() for i in values)
            recovered = stored(engine)
            assert len(recovered) == len(set(recovered)), f"a row twice (fail_at={fail_at})"
            assert set(expected) <= set(recovered), f"an acknowledged commit lost (fail_at={fail_at})"
            # Every acknowledged commit is there once; the driver's retry of each batch (its stages
            # written again) completes what was not acknowledged, never twice.
            await staging_workload(engine, {})
            assert stored(engine) == sorted([*range(20), *range(100, 120)]), f"fail_at={fail_at}"
        finally:
            await engine.close()
