"""The streams server's clients as the benchmarks drive them (bench/streams.py, bench/streams_storage.py):
appends and reads over HTTP, a consumer group's rebalance and commit round trips."""

from __future__ import annotations

import statistics
import time

from harness import percentile, rate
from meshplane.core.streamlog import decode_event
from meshplane.streams.client import StreamsClient

DATA = "x" * 100
BATCH = 1000


async def meshplane_http(url: str, events: int) -> dict[str, float]:
    async with StreamsClient(url, timeout=300) as client:
        await client.create_topic("bench", 1)
        batch = [{"event_type": "bench", "data": DATA} for _ in range(BATCH)]
        started = time.perf_counter()
        for _ in range(events // BATCH):
            await client.publish_batch("bench", batch, partition=0)
        append = time.perf_counter() - started
        started = time.perf_counter()
        offset = read = 0
        while read < events:
            page = await client.consume_partition("bench", 0, offset, 1000)
            read += page["count"]
            offset = page["next_offset"]
        consume = time.perf_counter() - started
        raw = {}
        for decoded in (False, True):
            started = time.perf_counter()
            offset = 0
            while offset < events:
                fetched = await client.fetch("bench", 0, offset, 1 << 20)
                if decoded:
                    for record in fetched.records:
                        decode_event(record.payload)
                offset = fetched.records[-1].offset + 1
            raw["decoded" if decoded else "records"] = time.perf_counter() - started
    return {
        "append_per_s": rate(events, append),
        "consume_json_per_s": rate(events, consume),
        "consume_per_s": rate(events, raw["records"]),
        "consume_decoded_per_s": rate(events, raw["decoded"]),
    }


async def group_round_trips(url: str, channel: bool, rounds: int, commits: int) -> dict[str, float]:
    """A 10th member joining 9 (rebalance), then offset commits one after another."""
    kind = "channel" if channel else "http"
    async with StreamsClient(url, channel=channel) as client:
        await client.create_topic(f"grouped-{kind}", 12)
        await client.create_group(f"bench-{kind}", f"grouped-{kind}", strategy="sticky")
        for i in range(9):
            await client.join(f"bench-{kind}", member_id=f"m{i}")
        joins = []
        for _ in range(rounds):
            started = time.perf_counter()
            await client.join(f"bench-{kind}", member_id="m9")
            joins.append(time.perf_counter() - started)
            await client.leave(f"bench-{kind}", "m9")
        member = await client.join(f"bench-{kind}", member_id="m9")
        partition, generation = member["partitions"][0], member["generation"]
        latencies = []
        for i in range(commits):
            started = time.perf_counter()
            await client.commit(f"bench-{kind}", partition, i, member_id="m9", generation=generation)
            latencies.append(time.perf_counter() - started)
    return {
        f"rebalance_{kind}_p50_ms": round(statistics.median(joins) * 1000, 3),
        f"rebalance_{kind}_p99_ms": round(percentile(joins, 0.99) * 1000, 3),
        f"commit_{kind}_p50_ms": round(statistics.median(latencies) * 1000, 3),
        f"commit_{kind}_p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
    }
