"""Issue 35: a data directory written by two servers at once started with 7,065 ERROR lines and no
advice. Now: one summary line (how many, where, the first, the command that lists them), and the
good records still served."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.support.cli import run_cli


def test_a_log_with_thousands_of_problems_starts_with_one_summary(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def fill(url: str) -> None:
        async with StreamsClient(url) as client:
            await client.create_topic("doubled", 1)
            for start in range(0, 3000, 500):
                await client.publish_batch(
                    "doubled", [{"event_type": "e", "data": {"i": i}} for i in range(start, start + 500)]
                )

    with StreamsServerProcess(data_dir=data) as server:
        server.start()
        asyncio.run(fill(server.url))
    segment = next((data / "topics" / "doubled" / "0").glob("*.log"))
    written = segment.read_bytes()
    # What two writers leave: the second's records (here, a copy of the first's, cut at odd places)
    # interleaved with the first's.
    pieces = [written[i : i + 977] for i in range(0, len(written), 977)]
    segment.write_bytes(b"".join(piece + piece[: len(piece) // 2] for piece in pieces))

    with StreamsServerProcess(data_dir=data) as server:
        server.start()
        errors = [line for line in server.log_path.read_text().splitlines() if " ERROR " in line]

        async def first_events() -> list[int]:
            async with StreamsClient(server.url) as client:
                answer = await client.consume_partition("doubled", 0, 0, 10)
            return [event["data"]["i"] for event in answer["events"]]

        assert asyncio.run(first_events())[:1] == [0]
    assert len(errors) == 1, errors[:5]
    found = re.search(r"(\d+) problem\(s\)", errors[0])
    assert found is not None
    assert int(found[1]) > 10  # each was a line of its own
    assert "problem(s) in 1 log(s) found at start (topic doubled/0: " in errors[0]
    assert f"`meshplane log verify --data-dir {data}` lists every one" in errors[0]
    verify = run_cli(
        "log",
        "verify",
        "--data-dir",
        str(data),
    )
    assert verify.returncode in (0, 1)  # recovery set the damage aside; verify says what remains
