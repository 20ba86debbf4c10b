"""Corrupt data directories: truncated and garbage tails, flipped bytes in the active segment, near the
end of a sealed one and inside its indexed part, missing segments, garbage and missing metadata. The
valid data is kept, the bad part set aside and reported, the server starts and serves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from meshplane.core.streamlog import StoredEvent
from meshplane.streams.errors import CorruptRecords
from meshplane.streams.log import PartitionLog
from meshplane.streams.segments import QUARANTINE
from meshplane.streams.service import StreamsConfig, StreamsService

SEGMENT = 4_000


def payload(i: int) -> bytes:
    return f"{i:06d}".encode() * 20  # 120 bytes, 144 with the header: ~27 records a segment


def written_log(directory: Path, count: int = 200) -> list[bytes]:
    plog = PartitionLog(directory, segment_bytes=SEGMENT, index_interval=500)
    records = [payload(i) for i in range(count)]
    for record in records:
        plog.append([record], 1)
    plog.close()
    return records


def reopen(directory: Path) -> PartitionLog:
    return PartitionLog(directory, segment_bytes=SEGMENT, index_interval=500)


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x40
    path.write_bytes(bytes(data))


def readable(plog: PartitionLog) -> dict[int, bytes]:
    """Every record that can be read, skipping holes as a reader told CorruptRecords would."""
    out: dict[int, bytes] = {}
    offset = plog.start_offset
    while offset < plog.next_offset:
        skip_to: int | None = None
        try:
            records = plog.read(offset, 1_000, 1 << 30)
        except CorruptRecords as exc:
            skip_to = exc.next_offset
        if skip_to is not None:
            assert skip_to > offset
            offset = skip_to
            continue
        if not records:
            break
        out.update((r.offset, r.payload) for r in records)
        offset = records[-1].offset + 1
    return out


def quarantined(directory: Path) -> list[Path]:
    return sorted((directory / QUARANTINE).glob("*"))


def test_a_truncated_tail_is_cut_and_set_aside(tmp_path: Path) -> None:
    records = written_log(tmp_path)
    active = segments(tmp_path)[-1]
    with open(active, "r+b") as f:
        f.truncate(active.stat().st_size - 50)
    plog = reopen(tmp_path)
    assert plog.next_offset == 199
    assert readable(plog) == dict(enumerate(records[:199]))
    assert len(quarantined(tmp_path)) == 1  # the torn record's 94 bytes, for inspection
    assert plog.append([b"next"], 2) == 199  # the lost offset is the next one: nobody was told it


def test_garbage_after_the_tail_is_set_aside(tmp_path: Path) -> None:
    records = written_log(tmp_path)
    with open(segments(tmp_path)[-1], "ab") as f:
        f.write(b"\x00\x01garbage" * 30)
    plog = reopen(tmp_path)
    assert plog.next_offset == 200
    assert readable(plog) == dict(enumerate(records))
    assert quarantined(tmp_path)[0].read_bytes() == b"\x00\x01garbage" * 30
    assert plog.problems


def test_a_flipped_byte_in_the_middle_of_the_active_segment_costs_one_record(tmp_path: Path) -> None:
    records = written_log(tmp_path)
    active = segments(tmp_path)[-1]
    base = int(active.stem)
    flip(active, 144 * 3 + 40)  # inside the fourth record's payload
    plog = reopen(tmp_path)
    assert plog.next_offset == 200  # the records after it are kept, their offsets not reused
    found = readable(plog)
    assert set(range(200)) - set(found) == {base + 3}
    assert all(found[o] == records[o] for o in found)
    with pytest.raises(CorruptRecords) as raised:
        plog.read(base + 3, 10)
    assert (raised.value.first, raised.value.next_offset) == (base + 3, base + 4)
    assert raised.value.kind == "CorruptRecords"
    assert [r.offset for r in plog.read(base + 1, 10)] == [base + 1, base + 2]  # stops before it
    assert plog.append([b"next"], 2) == 200


def test_a_bad_record_near_the_end_of_a_sealed_segment_keeps_the_later_segments(tmp_path: Path) -> None:
    records = written_log(tmp_path)
    first = segments(tmp_path)[0]
    flip(first, first.stat().st_size - 30)  # the last record of the first segment
    plog = reopen(tmp_path)
    plog.verify_step(1 << 30)
    found = readable(plog)
    last_of_first = int(segments(tmp_path)[1].stem) - 1
    assert set(range(200)) - set(found) == {last_of_first}
    assert all(found[o] == records[o] for o in found)
    assert len(segments(tmp_path)) > 5  # nothing after it was removed


def test_a_flipped_byte_in_the_indexed_part_is_found_by_verification_or_by_the_read(tmp_path: Path) -> None:
    records = written_log(tmp_path)
    first = segments(tmp_path)[0]
    flip(first, 144 * 10 + 60)  # record 10: before the last index entry, trusted when the log opens
    for find_by_reading in (False, True):
        plog = reopen(tmp_path)
        assert plog.hole_at(10) is None  # not seen at start: sealed segments are checked later
        if not find_by_reading:
            assert plog.verify_step(1 << 30) > 0
            assert plog.hole_at(10) is not None
        with pytest.raises(CorruptRecords) as raised:  # a specific, skippable error, not a 500
            plog.read(10, 5)
        assert raised.value.next_offset == 11
        found = readable(plog)
        assert set(range(200)) - set(found) == {10}
        assert all(found[o] == records[o] for o in found)
        plog.close()


def test_raw_reads_stop_before_a_hole_and_refuse_to_start_in_one(tmp_path: Path) -> None:
    written_log(tmp_path)
    active = segments(tmp_path)[-1]
    base = int(active.stem)
    flip(active, 144 * 5 + 40)
    plog = reopen(tmp_path)
    span = plog.raw_span(base, 1 << 20)
    assert span is not None
    assert span[2] == 144 * 5  # the five records before it, not the corrupt bytes
    with pytest.raises(CorruptRecords):
        plog.raw_span(base + 5, 1 << 20)
    assert plog.raw_span(base + 6, 1 << 20) is not None


def test_a_missing_segment_is_a_reported_hole(tmp_path: Path) -> None:
    written_log(tmp_path)
    gone = segments(tmp_path)[2]
    lost = range(int(gone.stem), int(segments(tmp_path)[3].stem))
    gone.unlink()
    plog = reopen(tmp_path)
    found = readable(plog)
    assert set(range(200)) - set(found) == set(lost)
    assert any("missing" in p for p in plog.problems)


# --- metadata --------------------------------------------------------------------------------------


async def engine_with_data(directory: Path) -> None:
    engine = StreamsService(StreamsConfig(data_dir=directory))
    await engine.start()
    await engine.create_topic("t", 2)
    await engine.publish_topic("t", [StoredEvent(f"e{i}", "e", i) for i in range(10)])
    await engine.create_group("g", "t")
    await engine.commit("g", 0, 3, None, None)
    await engine.publish_room("r", "e", 1)
    await engine.close()


@pytest.mark.parametrize(
    ("path", "damage"),
    [
        ("topics/t/topic.json", b"{garbage"),
        ("topics/t/topic.json", None),
        ("rooms/r/room.json", b"[1, 2"),
        ("rooms/r/room.json", None),
        ("groups/g.json", b"\x00\x01"),
        ("groups/g.offsets", b"\xff" * 30),
        ("idempotency.log", b"\x00" * 100),
    ],
)
async def test_garbage_or_missing_metadata_is_set_aside_and_the_server_starts(
    tmp_path: Path, path: str, damage: bytes | None
) -> None:
    await engine_with_data(tmp_path)
    target = tmp_path / path
    if damage is None:
        target.unlink()
    else:
        target.write_bytes(damage)
    engine = StreamsService(StreamsConfig(data_dir=tmp_path))
    await engine.start()
    try:
        # The events are all there whatever metadata was lost: settings come back as defaults.
        topic = engine.topic("t")
        assert sum(plog.next_offset for plog in topic.partitions) == 10
        _, events = engine.read_room("r", 0, 10)
        assert [e.body.data for e in events] == [1]
        if path.startswith("groups/g.json"):
            assert "g" not in engine.groups
            assert list((tmp_path / "groups").glob("g.json.corrupt-*"))
        else:
            assert engine.group("g").committed.get(0) == (None if path.endswith("offsets") else 3)
        if damage is not None and path.endswith(".json"):
            assert list(target.parent.glob(f"{target.name}.corrupt-*"))  # set aside, not deleted
            assert any(target.name in p for p in engine.storage_problems())
        await engine.publish_topic("t", [StoredEvent("after", "e", 0)])  # and it serves
        if path.startswith("topics/t/"):
            assert json.loads(target.read_bytes())["num_partitions"] == 2
    finally:
        await engine.close()


def test_the_engine_checks_sealed_segments_in_the_background(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = StreamsService(StreamsConfig(data_dir=tmp_path, segment_bytes=20_000))
        await engine.start()
        await engine.create_topic("t", 1)
        for i in range(300):  # ~150 bytes each: two sealed segments, indexed every 4 KiB
            await engine.publish_topic("t", [StoredEvent(f"e{i}", "e", "x" * 100)])
        await engine.close()
        first = sorted((tmp_path / "topics/t/0").glob("*.log"))[0]
        flip(first, 100)
        engine = StreamsService(StreamsConfig(data_dir=tmp_path, segment_bytes=20_000))
        await engine.start()
        try:
            assert not engine.storage_problems()
            engine.maintain(0.0)  # one cleanup cycle verifies up to 4 MiB
            assert any("unreadable" in p for p in engine.storage_problems())
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_raw_reads_of_a_sealed_segment_are_checked_before_they_are_handed_out(tmp_path: Path) -> None:
    written_log(tmp_path)
    first = segments(tmp_path)[0]
    flip(first, 144 * 10 + 60)  # indexed part: trusted when the log opens
    plog = reopen(tmp_path)
    span = plog.raw_span(0, 1 << 20)
    assert span is not None
    assert span[2] == 144 * 10  # records 0..9, never the damaged bytes
    with pytest.raises(CorruptRecords):
        plog.raw_span(10, 1 << 20)
