"""The real thing: a small tmpfs filled by publishers until the disk is full, then kill -9 and a restart
on the still-full disk. Every acknowledged event is there at its offset; refused ones left no trace."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from meshplane.launchers import StreamsServerProcess

PAD = "x" * 5_000  # 5 KB events, as in the report


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs (root is there in CI and on the team's machines)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


async def test_a_full_disk_loses_no_acknowledged_event(small_disk: Path) -> None:
    server = StreamsServerProcess(
        data_dir=small_disk / "data", extra_args=("--fsync", "always", "--segment-bytes", "262144")
    )
    acked: dict[tuple[int, int], str] = {}
    refused = 0
    commits: dict[int, int] = {}
    try:
        server.start()
        async with aiohttp.ClientSession(server.url) as http:
            async with http.post("/topics/t", json={"num_partitions": 2}) as r:
                assert r.status in (200, 201)
            async with http.post("/consumer-groups/g", json={"topic": "t"}) as r:
                assert r.status in (200, 201)
            n = 0
            while refused < 30 and n < 2_000:
                batch = [{"event_type": "e", "key": f"k{n + i}", "data": f"{n + i}:{PAD}"} for i in (0, 1)]
                n += 2
                async with http.post("/topics/t/publish", json={"events": batch}) as r:
                    if r.status == 507:
                        refused += 1
                        assert "nothing was stored" in (await r.json())["error"]
                        continue
                    assert r.status == 200, await r.text()
                    for result, event in zip((await r.json())["results"], batch, strict=True):
                        acked[(result["partition_id"], result["offset"])] = event["data"]
                if n % 20 == 0 and acked:
                    partition, offset = max(acked)
                    body = {"partition_id": partition, "offset": offset}
                    async with http.post("/consumer-groups/g/offsets/commit", json=body) as r:
                        if r.status == 200:
                            commits[partition] = offset
                        else:
                            assert r.status == 507, await r.text()
        assert refused == 30  # the disk did fill up
        assert len(acked) > 200
        server.kill()  # kill -9 on the full disk
        server.start()
        async with aiohttp.ClientSession(server.url) as http:
            for partition in (0, 1):
                found: dict[int, str] = {}
                offset = 0
                while True:
                    path = f"/topics/t/partitions/{partition}/consume"
                    async with http.post(path, json={"from_offset": offset, "limit": 1000}) as r:
                        assert r.status == 200, await r.text()
                        events = (await r.json())["events"]
                    if not events:
                        break
                    found.update((e["offset"], e["data"]) for e in events)
                    offset = events[-1]["offset"] + 1
                assert sorted(found) == list(range(len(found)))  # no gap, no offset given twice
                mine = {o: d for (p, o), d in acked.items() if p == partition}
                assert found == mine  # every acknowledged event, and nothing refused
            for partition, offset in commits.items():
                async with http.get(f"/consumer-groups/g/offsets/{partition}") as r:
                    assert (await r.json())["offset"] == offset
    finally:
        server.cleanup()
