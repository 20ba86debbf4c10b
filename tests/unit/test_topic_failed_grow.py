"""A grow that fails opening a new partition (ENOSPC) leaves nothing behind: neither a partition the
caller was told was not made, nor a topic the caller deleted, comes back after a restart."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from meshplane.errors import MeshplaneError
from meshplane.streams.log import PartitionLog
from meshplane.streams.service import StreamsConfig, StreamsService


def fail_opening_partition_1(monkeypatch: pytest.MonkeyPatch, error: int) -> None:
    """Opening any topic's partition 1 fails with ``error`` (until ``monkeypatch.undo()``)."""
    recover = PartitionLog._recover

    def failing(log: PartitionLog) -> None:
        if log.directory.name == "1":
            raise OSError(error, os.strerror(error))
        recover(log)

    monkeypatch.setattr(PartitionLog, "_recover", failing)


async def test_a_failed_grow_leaves_no_partition_and_no_topic_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StreamsConfig(data_dir=tmp_path, fsync="never")
    engine = StreamsService(config)
    await engine.start()
    try:
        await engine.create_topic("kept", 1)
        await engine.create_topic("gone", 1)
        fail_opening_partition_1(monkeypatch, errno.ENOSPC)
        for name in ("kept", "gone"):
            with pytest.raises(MeshplaneError):
                await engine.add_partitions(name, 2)
        monkeypatch.undo()
        assert await engine.delete_topic("gone")
    finally:
        await engine.close()
    engine = StreamsService(config)
    await engine.start()
    try:
        assert sorted(engine.topic_store.topics) == ["kept"], "a deleted topic came back"
        assert len(engine.topic_store.topics["kept"].partitions) == 1, "the failed grow's partition came back"
    finally:
        await engine.close()


async def test_a_partition_failing_to_open_at_start_deletes_no_other_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO (or EMFILE) opening partition 1 of a topic at start: the start fails, and partition 0's
    events, acknowledged before, are still on disk for the next start."""
    config = StreamsConfig(data_dir=tmp_path, fsync="never")
    engine = StreamsService(config)
    await engine.start()
    try:
        await engine.create_topic("t", 2)
    finally:
        await engine.close()
    segments = sorted((tmp_path / "topics" / "t" / "0").iterdir())
    assert segments
    fail_opening_partition_1(monkeypatch, errno.EIO)
    with pytest.raises(MeshplaneError):
        await StreamsService(config).start()
    monkeypatch.undo()
    assert sorted((tmp_path / "topics" / "t" / "0").iterdir()) == segments, "partition 0's log was deleted"
