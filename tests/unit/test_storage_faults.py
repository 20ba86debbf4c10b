"""Every write, fsync, rename and truncate of the partition log fails in turn (ENOSPC, EIO), then the
process dies: every acknowledged record is still there at its offset, and no offset ever answers two
different records."""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from meshplane.core.streamlog import StoredEvent
from meshplane.streams.errors import StorageError, http_status
from meshplane.streams.log import PartitionLog
from meshplane.streams.service import StreamsConfig, StreamsService
from tests.faults import FaultInjector, crash

ERRORS = [errno.ENOSPC, errno.EIO]
DOCS = Path(__file__).resolve().parents[2] / "docs"


def payload(i: int) -> bytes:
    return f"record-{i:05d}-".encode() * 40  # 520 bytes: an index entry every few records


def append_workload(plog: PartitionLog, acked: dict[int, bytes], seen: dict[int, bytes]) -> list[str]:
    """Appends of 1-3 records across several segment rolls; remembers what was acknowledged and what
    each offset answered to a reader."""
    failures = []
    n = 0
    for batch in range(40):
        records = [payload(n + i) for i in range(1 + batch % 3)]
        n += len(records)
        try:
            first = plog.append(records, 1_000 + batch)
        except StorageError as exc:
            failures.append(str(exc))
            continue
        for i, record in enumerate(records):
            acked[first + i] = record
        for read in plog.read(first, len(records)):
            assert seen.setdefault(read.offset, read.payload) == read.payload, "an offset answered twice"
    return failures


def count_operations(tmp_path: Path) -> int:
    with FaultInjector(tmp_path / "dry").installed() as counter:
        plog = PartitionLog(tmp_path / "dry", segment_bytes=8_000, index_interval=1_000)
        append_workload(plog, {}, {})
        plog.close()
    return counter.count


@pytest.mark.parametrize("error", ERRORS, ids=errno.errorcode.get)
def test_a_failed_append_leaves_no_trace_and_a_crash_loses_nothing_acknowledged(
    shm_path: Path, error: int
) -> None:
    total = count_operations(shm_path)
    assert total > 60  # the workload does open, write, fsync, rename and truncate: each gets its turn
    for fail_at in range(1, total + 1):
        directory = shm_path / f"{error}-{fail_at}"
        acked: dict[int, bytes] = {}
        seen: dict[int, bytes] = {}
        injector = FaultInjector(directory, fail_at, error)
        with injector.installed():
            try:
                plog = PartitionLog(directory, segment_bytes=8_000, index_interval=1_000)
            except StorageError:
                plog = None  # the very first open failed: nothing was acknowledged
            failures = append_workload(plog, acked, seen) if plog is not None else []
        if plog is None:  # what the failed open left must open next time
            PartitionLog(directory, segment_bytes=8_000, index_interval=1_000).close()
            continue
        assert injector.failed is not None
        assert len(failures) <= 1, failures
        # kill -9: nothing more is written; the next process recovers from the files alone.
        plog.close()
        recovered = PartitionLog(directory, segment_bytes=8_000, index_interval=1_000)
        records = {r.offset: r.payload for r in recovered.read(0, 10_000, max_bytes=1 << 30)}
        where = f"failure at {injector.failed} ({fail_at} of {total})"
        for offset, record in acked.items():
            assert records.get(offset) == record, f"acknowledged offset {offset} lost after {where}"
        for offset, record in seen.items():
            assert records.get(offset) == record, f"offset {offset} answers another record after {where}"
        assert sorted(records) == list(range(len(records))), where
        # And the log goes on: the next append takes the next offset.
        assert recovered.append([b"after"], 5) == len(records)
        recovered.close()


# --- the engine: creates, publishes, idempotent retries, commits, rooms ------------------------------


def event(i: int, key: str | None = None) -> StoredEvent:
    return StoredEvent(f"ev-{i}", "e", {"i": i, "pad": "x" * 300}, key)


class Acknowledged:
    def __init__(self) -> None:
        self.events: dict[tuple[int, int], str] = {}  # (partition, offset) -> event id
        self.room: dict[int, int] = {}  # room offset -> data
        self.commits: dict[int, int] = {}  # partition -> last acknowledged commit
        self.unsynced_commits: dict[int, int] = {}  # written, then its fsync failed: may be kept
        self.idempotent: dict[str, list[tuple[int, int]]] = {}
        self.failures: list[str] = []


async def engine_workload(engine: StreamsService, ack: Acknowledged) -> None:
    async def attempt(what: str, action: Callable[[], Awaitable[None]]) -> None:
        try:
            await action()
        except StorageError as exc:
            ack.failures.append(f"{what}: {http_status(exc)} {exc}")

    async def create() -> None:
        if "t" not in engine.topics:
            await engine.create_topic("t", 2, segment_bytes=4_096)
        if "g" not in engine.groups:
            await engine.create_group("g", "t")

    for round_ in range(12):
        await attempt("create", create)
        if "t" not in engine.topics:
            continue
        # Every batch is sent twice with its key (a retry): the second time appends nothing.
        first = 3 * (round_ // 2)
        batch = [event(first + i, key=f"k{(first + i) % 5}") for i in range(3)]

        async def publish(batch: list[StoredEvent] = batch, round_: int = round_) -> None:
            key = f"idem-{round_ // 2}"
            places = await engine.publish_topic("t", batch, idempotency_key=key)
            if key in ack.idempotent:
                assert places == ack.idempotent[key]
                return
            ack.idempotent[key] = places
            for (p, offset), e in zip(places, batch, strict=True):
                ack.events[(p, offset)] = e.id

        await attempt("publish", publish)

        async def commit(round_: int = round_) -> None:
            if "g" in engine.groups:
                partition = round_ % 2
                try:
                    await engine.commit("g", partition, round_, None, None)
                except StorageError as exc:
                    if "fsync" in str(exc):
                        ack.unsynced_commits[partition] = round_
                    raise
                ack.commits[partition] = round_

        await attempt("commit", commit)

        async def room(round_: int = round_) -> None:
            _, published = await engine.publish_room("r", "e", round_)
            ack.room[published.offset] = round_

        await attempt("room", room)


async def check_recovered(directory: Path, ack: Acknowledged, where: str) -> None:
    engine = StreamsService(StreamsConfig(data_dir=directory, fsync="always"))
    await engine.start()
    try:
        if ack.events or ack.commits:
            topic = engine.topic_store.get("t")
            for (p, offset), event_id in ack.events.items():
                (read,) = topic.read(p, offset, 1)
                assert read.body.id == event_id, f"acknowledged {p}/{offset} lost after {where}"
            for plog in topic.partitions:
                offsets = [r.offset for r in plog.read(0, 1_000, 1 << 30)]
                assert offsets == list(range(plog.next_offset)), where
            for key, places in ack.idempotent.items():  # a retry after the crash appends nothing
                retry = [event(0)] * len(places)
                assert await engine.publish_topic("t", retry, idempotency_key=key) == places
        for partition, offset in ack.commits.items():
            allowed = {offset, ack.unsynced_commits.get(partition)}
            assert engine.group("g").committed.get(partition) in allowed, f"commit lost after {where}"
        if ack.room:
            # A publish whose fsync failed was refused but may be kept (as it was read by then).
            _, events = engine.read_room("r", 0, 1_000)
            recovered = {e.offset: e.body.data for e in events}
            assert {o: recovered.get(o) for o in ack.room} == ack.room, where
    finally:
        await engine.close()


async def count_engine_operations(dry: Path) -> int:
    with FaultInjector(dry).installed() as counter:
        engine = StreamsService(StreamsConfig(data_dir=dry, fsync="always"))
        await engine.start()
        await engine_workload(engine, Acknowledged())
        total = counter.count  # what the workload does (a crash skips what close() would)
        await engine.close()
    assert {op for op, _ in counter.seen[:total]} >= {"open", "write", "fsync", "replace"}
    return total


async def run_engine_faults(tmp_path: Path, error: int) -> None:
    total = await count_engine_operations(tmp_path / "dry")
    for fail_at in range(1, total + 1):
        directory = tmp_path / f"{error}-{fail_at}"
        ack = Acknowledged()
        injector = FaultInjector(directory, fail_at, error)
        with injector.installed():
            engine = StreamsService(StreamsConfig(data_dir=directory, fsync="always"))
            try:
                await engine.start()
            except StorageError:
                crash(engine)  # a start that failed acknowledged nothing; the next one starts
                await check_recovered(directory, ack, f"a failed start ({fail_at} of {total})")
                continue
            await engine_workload(engine, ack)
        crash(engine)
        assert injector.failed is not None
        assert len(ack.failures) <= 1, ack.failures
        assert all(f.split(": ", 1)[1].startswith(("503 ", "507 ")) for f in ack.failures), ack.failures
        await check_recovered(directory, ack, f"failure at {injector.failed} ({fail_at} of {total})")


@pytest.mark.parametrize("error", ERRORS, ids=errno.errorcode.get)
async def test_engine_operations_fail_in_turn_and_nothing_acknowledged_is_lost(
    shm_path: Path, error: int
) -> None:
    await run_engine_faults(shm_path, error)


async def test_the_docs_cite_the_operations_failed_in_turn(tmp_path: Path) -> None:
    """docs/streams.md and docs/performance.md say how many operations fail in turn: these."""
    log_ops, engine_ops = count_operations(tmp_path), await count_engine_operations(tmp_path / "engine")
    streams, performance = (DOCS / "streams.md").read_text(), (DOCS / "performance.md").read_text()
    flat = " ".join(streams.split())
    assert f"each of the {log_ops} file operations of a partition-log workload" in flat
    assert f"each of the {engine_ops} of an engine workload" in flat
    flat = " ".join(performance.split())
    assert f"each of the {log_ops} file operations of a partition-log workload and the {engine_ops}" in flat
    assert f"{len(ERRORS) * (log_ops + engine_ops)} failures" in flat
