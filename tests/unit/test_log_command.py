"""``meshplane log verify|dump`` on real data directories, clean and damaged; files are only read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from meshplane.cli.main import main
from meshplane.core.streamlog import StoredEvent
from meshplane.streams.service import StreamsConfig, StreamsService


def make_data(root: Path) -> None:
    async def fill() -> None:
        engine = StreamsService(StreamsConfig(data_dir=root, segment_bytes=2_000))
        await engine.start()
        await engine.create_topic("orders", 2)
        events = [StoredEvent(f"e{i}", "order.created", {"n": i}, f"k{i}") for i in range(60)]
        await engine.publish_topic("orders", events)
        await engine.publish_room("chat", "message", {"text": "hi"})
        await engine.close()

    asyncio.run(fill())


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_verify_a_clean_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_data(tmp_path)
    assert main(["log", "verify", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "topic orders/0:" in out
    assert "room chat: 1 segment(s), 1 records, offsets 0..0: OK" in out
    assert out.strip().endswith("verified: no problems")


def test_verify_finds_a_flipped_byte_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_data(tmp_path)
    segment = sorted((tmp_path / "topics/orders/0").glob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    data[60] ^= 1
    segment.write_bytes(bytes(data))
    before = snapshot(tmp_path)
    assert main(["log", "verify", "--data-dir", str(tmp_path), "--json"]) == 1
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (bad,) = [r for r in reports if r.get("problems")]
    assert bad["log"] == "topic orders/0"
    assert "crc mismatch at byte 50" in bad["problems"][0]  # the second record
    assert "records resume at byte" in bad["problems"][0]
    assert snapshot(tmp_path) == before  # read-only


def test_dump_prints_records_and_where_they_are_bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_data(tmp_path)
    partition = tmp_path / "topics/orders/1"
    assert main(["log", "dump", str(partition), "--count", "3", "--payload"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["offset"] for line in lines] == [0, 1, 2]
    assert lines[0]["event_type"] == "order.created"
    assert "n" in lines[0]["data"]
    segment = sorted(partition.glob("*.log"))[0]
    with open(segment, "ab") as f:
        f.write(b"garbage")
    assert main(["log", "dump", str(segment)]) == 0
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["problem"] == "truncated header"
    assert last["resumes_at"] is None


def test_verify_says_what_is_not_a_data_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "verify", "--data-dir", str(tmp_path)]) == 2
    assert "is not a streams data directory" in capsys.readouterr().err
