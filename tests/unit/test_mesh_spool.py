"""Spools of guaranteed events (one per destination node): the window of unconfirmed events, rewinds,
limits, the confirmed offset across restarts, and every file operation failing in turn."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import msgspec
import pytest

from meshplane.core.mesh.frames import (
    FLAG_GUARANTEED,
    FLAG_JSON_MESSAGE,
    Frame,
    FrameType,
    decode_spooled,
    encode_event,
    encode_frame,
)
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.queue_items import stored_event
from meshplane.mesh.spool import Spool, SpoolFull, SpoolLimits, spool_directory, spool_peer
from meshplane.streams.errors import StorageError
from meshplane.streams.files import FilePool
from meshplane.streams.log import PartitionLog
from tests.faults import FaultInjector


def frame(i: int) -> bytes:
    return encode_event("origin", "orders.eu", i, 1_700_000_000_000 + i, b"body-%d" % i, FLAG_GUARANTEED)


def open_spool(directory: Path, **limits: Any) -> Spool:
    return Spool(directory, "b", SpoolLimits(**{"segment_bytes": 2_000, **limits}), FilePool(16))


def test_the_window_bounds_what_is_sent_before_confirmations(tmp_path: Path) -> None:
    spool = open_spool(tmp_path, window=4)
    for i in range(10):
        assert spool.append([frame(i)]) == i
    assert spool.to_send() == []  # nothing is on disk (and on the standby) yet
    spool.durable = 10
    sent = spool.to_send()
    assert [r.payload for r in sent] == [frame(i) for i in range(4)]
    spool.sent = 4
    assert spool.to_send() == []  # four unconfirmed: the window is full
    assert spool.confirm(1)  # 0 and 1 stored at the destination
    assert not spool.confirm(1)
    assert not spool.confirm(50)
    assert [r.offset for r in spool.to_send()] == [4, 5]
    spool.rewind()  # the link went down: what was unconfirmed goes again
    assert spool.sent == 2
    assert [r.offset for r in spool.to_send()] == [2, 3, 4, 5]
    assert spool.pending == 8
    spool.close()


def test_the_confirmed_offset_survives_a_restart_and_confirmed_segments_go(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    for i in range(100):
        spool.append([frame(i)])
    segments = len(spool.log.segments)
    assert segments > 3
    spool.confirm(79)
    spool.save()
    assert len(spool.log.segments) < segments  # whole segments below offset 80 deleted
    spool.log.close()  # no save on the way out: as after kill -9
    again = open_spool(tmp_path)
    assert again.acked == 80
    assert again.sent == 80
    assert again.pending == 20
    assert [r.payload for r in again.to_send()] == [frame(i) for i in range(80, 100)]
    again.close()


def test_a_torn_confirmed_offset_means_sending_again_not_losing(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    for i in range(5):
        spool.append([frame(i)])
    spool.close()
    (tmp_path / "acked").write_text("garbage")
    again = open_spool(tmp_path)
    assert again.acked == 0
    assert again.pending == 5
    again.close()


def test_the_confirmed_offset_is_synced_at_each_save_unless_fsync_is_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power loss then resends at most what was confirmed since the last save (the destination
    drops it as a resend: by the last offset it stored from this spool)."""
    import meshplane.mesh.spool as spool_module
    from meshplane.streams.files import write_atomic as real

    writes: list[tuple[str, bool]] = []

    def recorded(path: Path, data: bytes, *, sync: bool = True) -> None:
        writes.append((data.decode(), sync))
        real(path, data, sync=sync)

    monkeypatch.setattr(spool_module, "write_atomic", recorded)
    for sync in (True, False):
        spool = Spool(tmp_path / str(sync), "b", SpoolLimits(sync_acked=sync), FilePool(16))
        spool.append([frame(i) for i in range(10)])
        spool.confirm(4)
        spool.save()
        spool.confirm(8)
        spool.save()
        spool.close()
        assert writes == [("5", sync), ("9", sync)]
        writes.clear()


def test_a_new_spool_starts_where_it_is_told_and_keeps_its_offsets(tmp_path: Path) -> None:
    """Offsets of a destination's spool never start over (a new one starts at the clock in
    microseconds), since the destination drops what is at or below the last offset it stored."""
    from meshplane.mesh.spool import new_spool_offset

    start = new_spool_offset()
    spool = Spool(tmp_path, "b", SpoolLimits(), FilePool(16), start)
    assert spool.append([frame(0), frame(1)]) == start
    assert (spool.acked, spool.pending) == (start, 2)
    spool.close()
    again = Spool(tmp_path, "b", SpoolLimits(), FilePool(16), new_spool_offset())  # kept, not restarted
    assert (again.acked, again.log.next_offset) == (start, start + 2)
    again.close()
    assert new_spool_offset() > start + 2


def test_room_is_what_the_limits_leave_and_a_refusal_says_why(tmp_path: Path) -> None:
    spool = open_spool(tmp_path, max_events=3)
    for i in range(3):
        assert spool.room()[0] == 3 - i
        spool.append([frame(i)])
    assert spool.room()[0] == 0
    with pytest.raises(SpoolFull, match=r"spool for node .b. is full .* 3 events"):
        raise spool.refuse()
    by_bytes = open_spool(tmp_path / "bytes", max_bytes=500)
    by_bytes.append([frame(0)])
    assert by_bytes.room()[1] == 500 - by_bytes.log.size_bytes < 500
    assert spool.refused == 1
    assert by_bytes.refused == 0
    spool.close()
    by_bytes.close()


def test_directories_name_any_node_id() -> None:
    for peer in ("b", "node/../x", "ünï"):
        directory = spool_directory(Path("/spools"), peer)
        assert directory.parent == Path("/spools")
        assert spool_peer(directory) == peer
    assert spool_peer(Path("/spools/not-hex")) is None


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=errno.errorcode.get)
def test_each_failed_file_operation_loses_nothing_stored_and_leaves_no_trace(
    shm_path: Path, error: int
) -> None:
    def workload(spool: Spool, stored: list[bytes]) -> int:
        failures = 0
        for i in range(40):
            try:
                offset = spool.append([frame(i)])
            except StorageError:
                failures += 1
                continue
            assert offset == len(stored)
            stored.append(frame(i))
            if i % 10 == 9:
                spool.confirm(offset - 5)
                spool.save()  # a failure here is logged: confirmed offsets only resend
        return failures

    with FaultInjector(shm_path / "dry").installed() as counter:
        workload(open_spool(shm_path / "dry"), [])
    total = counter.count
    assert total > 40
    for fail_at in range(1, total + 1):
        directory = shm_path / f"{error}-{fail_at}"
        stored: list[bytes] = []
        injector = FaultInjector(directory, fail_at, error)
        with injector.installed():
            try:
                spool = open_spool(directory)
            except StorageError:
                continue
            assert workload(spool, stored) <= 1
        spool.log.close()  # kill -9
        again = open_spool(directory)
        kept = [r.payload for r in again.log.read(again.acked, 1000, 1 << 20)]
        where = f"failure at {injector.failed}"
        assert again.acked <= len(stored), where
        assert kept == stored[again.acked :], where  # every unconfirmed event, in order, nothing else
        again.close()


def test_a_spooled_frame_carries_exactly_one_event() -> None:
    inner = frame(7)
    spooled = Frame(FrameType.SPOOLED, 0, "a", "", 3, inner)
    event = decode_spooled(spooled)
    assert (event.type, event.sequence, event.raw) == (FrameType.EVENT, 7, inner)
    for payload in (b"", inner[:-1], inner + inner, encode_frame(FrameType.HEARTBEAT, "a"), b"\x00" * 40):
        with pytest.raises(ValueError, match="exactly one well-formed EVENT"):
            decode_spooled(Frame(FrameType.SPOOLED, 0, "a", "", 3, payload))


def test_queues_keep_pub_sub_payloads_as_json_and_other_bodies_as_bytes() -> None:
    message = msgspec.json.encode({"type": "message", "payload": {"id": 1}, "topic": "t"})
    json_event = MeshEvent("o", "t", 1, 5, message, FLAG_JSON_MESSAGE | FLAG_GUARANTEED)
    stored = stored_event(json_event)
    assert (stored.id, stored.event_type, stored.data, stored.key) == ("5-1-o", "t", {"id": 1}, "o")
    assert stored_event(MeshEvent("o", "t", 2, 5, b"\xff\x00")).data == b"\xff\x00"


def test_a_spool_reopened_after_a_crash_sends_its_tail_only_once_it_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --fsync interval a killed node leaves appends in the page cache, not on disk: a restarted
    node (or a standby taking over) that sent them at once, and then lost power, would spool other
    events at the same offsets, which the destination drops as resends. What it finds is sent once
    fsynced."""
    spool = open_spool(tmp_path)
    spool.append([frame(i) for i in range(3)])
    spool.log.close()  # killed: no fsync, no save
    synced: list[int] = []
    monkeypatch.setattr(PartitionLog, "sync", lambda log: synced.append(log.next_offset))
    reopened = open_spool(tmp_path)
    assert [r.payload for r in reopened.to_send()] == [frame(i) for i in range(3)]
    assert synced == [3], "sent what may not be on disk"
