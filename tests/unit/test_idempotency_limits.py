"""The idempotency answers' three bounds, as docs/streams.md's limits table states them: keys, bytes
and age; past any of them the oldest answer is forgotten and a retry appends again."""

from __future__ import annotations

import re
import time
import types
from pathlib import Path
from typing import Any

import pytest

from meshplane.core.streamlog import StoredEvent
from meshplane.streams import idempotency
from meshplane.streams.service import StreamsConfig, StreamsService

DOCS = Path(__file__).resolve().parents[2] / "docs" / "streams.md"


async def started(tmp_path: Path, **limits: Any) -> StreamsService:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path, **limits))
    engine.open()
    await engine.create_topic("t", 1)
    return engine


async def publish(engine: StreamsService, key: str) -> int:
    [(_, offset)] = await engine.publish_topic("t", [StoredEvent(key, "e", {}, None)], idempotency_key=key)
    return offset


async def test_past_the_key_limit_the_oldest_answer_is_forgotten(tmp_path: Path) -> None:
    engine = await started(tmp_path, idempotency_keys=3)
    try:
        offsets = [await publish(engine, f"k{i}") for i in range(5)]
        assert len(engine.idempotency.entries) == 3
        assert await publish(engine, "k4") == offsets[4]  # remembered: nothing appended
        assert await publish(engine, "k0") == 5  # forgotten: appended again
        assert engine.topics["t"].partitions[0].next_offset == 6
    finally:
        await engine.close()


async def test_past_the_byte_limit_the_oldest_answer_is_forgotten(tmp_path: Path) -> None:
    engine = await started(tmp_path, idempotency_bytes=1000)
    try:
        offsets = [await publish(engine, f"k{i}") for i in range(10)]
        assert 1 <= len(engine.idempotency.entries) < 10
        assert engine.idempotency.bytes <= 1000
        assert await publish(engine, "k9") == offsets[9]
        assert await publish(engine, "k0") == 10
    finally:
        await engine.close()


async def test_past_the_ttl_an_answer_is_forgotten_and_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await started(tmp_path, idempotency_ttl_secs=60.0)
    try:
        first = await publish(engine, "old")
        assert await publish(engine, "old") == first
        later = time.time() + 61
        monkeypatch.setattr(idempotency, "time", types.SimpleNamespace(time=lambda: later))
        assert await publish(engine, "old") == first + 1  # older than the TTL: appended again
        engine.idempotency.expire(later + 61)
        assert len(engine.idempotency.entries) == 0
    finally:
        await engine.close()


def test_the_documented_limits_are_the_defaults() -> None:
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| idempotency answers |"))
    found = re.search(r"([\d ]+) keys, (\d+) MiB, (\d+) days", row)
    assert found, row
    keys, mib, days = found.groups()
    config = StreamsConfig(data_dir=Path("unused"))
    assert config.idempotency_keys == int(keys.replace(" ", ""))
    assert config.idempotency_bytes == int(mib) << 20
    assert config.idempotency_ttl_secs == int(days) * 86400
