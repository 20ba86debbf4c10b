"""The partition log on real files: segments, index, recovery from torn and corrupt tails, retention."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplane.core.streamlog import RetentionPolicy
from meshplane.streams.log import PartitionLog


def fill(plog: PartitionLog, count: int, size: int = 50, batch: int = 1) -> list[bytes]:
    written = []
    for i in range(0, count, batch):
        chunk = [f"{n:06d}".encode() * (size // 6) for n in range(i, min(count, i + batch))]
        plog.append(chunk, 1_000 + i)
        written.extend(chunk)
    return written


def test_append_and_read_across_segments(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=2_000, index_interval=256)
    written = fill(plog, 500, batch=7)
    assert len(plog.segments) > 5
    assert plog.next_offset == 500
    for start in (0, 1, 37, 123, 250, 499):
        records = plog.read(start, 60)
        assert [r.offset for r in records] == list(range(start, min(500, start + 60)))
        assert [r.payload for r in records] == written[start : start + 60]
    assert plog.read(500, 10) == []


def test_reopen_continues_offsets(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=2_000)
    written = fill(plog, 120)
    plog.close()
    again = PartitionLog(tmp_path, segment_bytes=2_000)
    assert again.next_offset == 120
    assert again.append([b"next"], 5) == 120
    assert [r.payload for r in again.read(0, 200)] == [*written, b"next"]


def test_a_record_larger_than_a_read_chunk(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    big = os.urandom(3 << 20)
    plog.append([b"a", big, b"c"], 1)
    assert [r.payload for r in plog.read(0, 10, max_bytes=100)] == [b"a"]
    assert [r.payload for r in plog.read(1, 1)] == [big]
    plog.close()
    assert [r.payload for r in PartitionLog(tmp_path).read(0, 10, max_bytes=8 << 20)] == [b"a", big, b"c"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 60), st.data())
def test_recovery_after_a_crash_at_any_byte(count: int, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        plog = PartitionLog(directory, segment_bytes=1_500, index_interval=200)
        written = fill(plog, count, size=30, batch=data.draw(st.integers(1, 5)))
        plog.close()
        active = sorted(directory.glob("*.log"))[-1]
        size = active.stat().st_size
        cut = data.draw(st.integers(0, size))
        garbage = data.draw(st.binary(max_size=40))
        with open(active, "r+b") as f:  # a torn write, then whatever the disk held after it
            f.truncate(cut)
            f.seek(cut)
            f.write(garbage)
        recovered = PartitionLog(directory, segment_bytes=1_500, index_interval=200)
        records = recovered.read(0, 10_000, max_bytes=1 << 30)
        n = recovered.next_offset
        assert [r.offset for r in records] == list(range(n))
        assert [r.payload for r in records] == written[:n]  # a prefix, every record intact
        base = int(active.stem)
        assert n >= base  # sealed segments are untouched
        # Offsets continue where the valid records end, and new appends read back.
        assert recovered.append([b"after"], 1) == n
        recovered.close()
        again = PartitionLog(directory, segment_bytes=1_500, index_interval=200)
        assert again.read(n, 1)[0].payload == b"after"
        again.close()


def test_a_torn_index_of_a_sealed_segment_is_cut_and_the_rest_scanned(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, index_interval=100, segment_bytes=6_000)
    written = fill(plog, 200)
    plog.close()
    index = sorted(tmp_path.glob("*.index"))[0]  # sealed segments' indexes are written when they roll
    index.write_bytes(index.read_bytes()[:-5])  # a torn index entry
    again = PartitionLog(tmp_path, index_interval=100, segment_bytes=6_000)
    assert [r.payload for r in again.read(0, 200, max_bytes=1 << 20)] == written
    assert [r.payload for r in again.read(50, 50)] == written[50:100]


def test_the_active_segment_keeps_its_index_in_memory(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, index_interval=100)
    fill(plog, 200)
    assert len(plog.active.index_offsets) > 10
    assert not list(tmp_path.glob("*.index"))  # one write per append: the index costs no syscall
    plog.close()
    again = PartitionLog(tmp_path, index_interval=100)
    assert again.active.index_offsets == plog.active.index_offsets  # rebuilt by the scan on start


def test_count_retention_is_exact_and_deletes_whole_segments(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=1_000, retention=RetentionPolicy(max_messages=40))
    fill(plog, 100)
    assert plog.start_offset == 60
    before = len(plog.segments)
    removed = plog.apply_retention(now_ms=0)
    assert removed > 0
    assert len(plog.segments) < before
    assert plog.segments[0].base_offset <= 60  # never deletes a readable record
    assert [r.offset for r in plog.read(60, 100)] == list(range(60, 100))


def test_time_retention_by_segment_age(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=1_000, retention=RetentionPolicy(retention_secs=10))
    for i in range(60):
        plog.append([b"x" * 50], 1_000 + i * 1_000)  # one second apart
    newest = plog.last_timestamp_ms
    assert newest is not None
    plog.apply_retention(now_ms=newest)
    oldest_kept = plog.segments[0]
    assert oldest_kept.last_timestamp_ms is not None
    assert newest - oldest_kept.last_timestamp_ms <= 10_000
    assert all(r.timestamp_ms >= newest - 20_000 for r in plog.read(plog.start_offset, 100))


def test_size_retention(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=1_000, retention=RetentionPolicy(max_bytes=3_000))
    fill(plog, 200)
    plog.apply_retention(now_ms=0)
    assert 3_000 <= plog.size_bytes < 3_000 + 1_100


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(-50, 100)), min_size=1, max_size=40),
    st.integers(0, 3000),
    st.integers(0, 30),
)
def test_offset_for_time_is_the_first_event_stamped_then_or_later(
    batches: list[tuple[int, int]], wanted: int, keep: int
) -> None:
    """Found by search over segments and index entries; the same as a scan of every record. A clock
    set back stamps with the last time, so stamps never decrease."""
    with tempfile.TemporaryDirectory() as directory:
        retention = RetentionPolicy(max_messages=keep + 1) if keep % 2 else None  # a start inside a segment
        plog = PartitionLog(Path(directory), segment_bytes=600, index_interval=64, retention=retention)
        clock = 1000
        for count, step in batches:
            clock += step
            plog.append([b"x" * 40] * count, clock)
        plog.apply_retention(0, keep_from=min(keep, plog.next_offset))
        records = plog.read(plog.start_offset, 10_000, 1 << 20)
        stamps = [r.timestamp_ms for r in records]
        assert stamps == sorted(stamps)
        expected = next((r.offset for r in records if r.timestamp_ms >= wanted), plog.next_offset)
        assert plog.offset_for_time(wanted) == expected
        plog.close()
