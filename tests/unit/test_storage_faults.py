"""Every write, fsync, rename and truncate of the partition log fails in turn (ENOSPC, EIO), then the
process dies: every acknowledged record is still there at its offset, and no offset ever answers two
different records."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from meshplane.streams.errors import StorageError
from meshplane.streams.log import PartitionLog
from tests.faults import FaultInjector

ERRORS = [errno.ENOSPC, errno.EIO]


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
    tmp_path: Path, error: int
) -> None:
    total = count_operations(tmp_path)
    assert total > 60  # the workload does open, write, fsync, rename and truncate: each gets its turn
    for fail_at in range(1, total + 1):
        directory = tmp_path / f"{error}-{fail_at}"
        acked: dict[int, bytes] = {}
        seen: dict[int, bytes] = {}
        injector = FaultInjector(directory, fail_at, error)
        with injector.installed():
            try:
                plog = PartitionLog(directory, segment_bytes=8_000, index_interval=1_000)
            except StorageError:
                continue  # the very first open failed: nothing was acknowledged
            failures = append_workload(plog, acked, seen)
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
