"""Durable streams benchmark: meshplane against Redis Streams and NATS JetStream, same run, same machine.

    python bench/streams.py                       # results to bench/results/streams.json
    python bench/streams.py --events 100000

Measured (100-byte payloads, one partition / stream):
- append: meshplane over HTTP (batches of 1000 per request, fsync every 10 ms) and its storage engine
  in-process; Redis XADD pipelined x1000 (appendfsync everysec, Redis's tightest periodic fsync);
  JetStream publish_async (file storage).
- consume: meshplane's bulk fetch (raw records, 1 MiB per request, scanned by the client; also with
  every payload decoded), its JSON consume route (limit 1000) and engine reads; Redis XREADGROUP
  COUNT 1000 + XACK; JetStream pull fetch(1000) + ack.
- consumer groups: rebalance time when a 10th member joins (HTTP round trip and the coordinator
  alone), offset-commit latency p50/p99 over HTTP.
- WebSocket fan-out: publish-to-receive latency to 100 WebSocket subscribers in another process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from meshplane.core.groups import GroupCoordinator
from meshplane.core.streamlog import StoredEvent, decode_event, encode_event
from meshplane.servers import NatsServer, StreamsServerProcess, free_port
from meshplane.streams.client import StreamsClient
from meshplane.streams.engine import StreamEngine, StreamsConfig
from meshplane.streams.log import PartitionLog

DATA = "x" * 100
BATCH = 1000


def rate(events: int, seconds: float) -> float:
    return round(events / seconds, 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- meshplane -------------------------------------------------------------------------------------


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


async def meshplane_engine(directory: Path, events: int) -> dict[str, float]:
    """The storage engine alone: encode + append with an fsync every 10 ms, then read + decode."""
    plog = PartitionLog(directory)
    payloads_needed = events // BATCH
    started = time.perf_counter()
    last_sync = started
    for _ in range(payloads_needed):
        plog.append([encode_event(StoredEvent("id", "bench", DATA)) for _ in range(BATCH)], 0)
        now = time.perf_counter()
        if now - last_sync >= 0.01:
            await asyncio.to_thread(plog.sync)
            last_sync = now
    plog.sync()
    append = time.perf_counter() - started
    started = time.perf_counter()
    offset = 0
    while offset < events:
        records = plog.read(offset, 1000)
        for record in records:
            decode_event(record.payload)
        offset = records[-1].offset + 1
    consume = time.perf_counter() - started
    plog.close()
    return {"append_per_s": rate(events, append), "consume_per_s": rate(events, consume)}


async def group_timings(url: str, rounds: int, commits: int) -> dict[str, float]:
    async with StreamsClient(url) as client:
        await client.create_topic("grouped", 12)
        await client.create_group("bench-group", "grouped", strategy="sticky")
        for i in range(9):
            await client.join("bench-group", member_id=f"m{i}")
        joins = []
        for _ in range(rounds):
            started = time.perf_counter()
            await client.join("bench-group", member_id="m9")
            joins.append(time.perf_counter() - started)
            await client.leave("bench-group", "m9")
        member = await client.join("bench-group", member_id="m9")
        partition = member["partitions"][0]
        latencies = []
        for i in range(commits):
            started = time.perf_counter()
            await client.commit("bench-group", partition, i, member_id="m9", generation=member["generation"])
            latencies.append(time.perf_counter() - started)
    group = GroupCoordinator("g", "t", 12, strategy="sticky")
    for i in range(9):
        group.join(f"m{i}", 0)
    started = time.perf_counter()
    for _ in range(1000):
        group.join("m9", 0)
        group.leave("m9", 0)
    coordinator = (time.perf_counter() - started) / 2000
    with tempfile.TemporaryDirectory() as tmp:  # the commit path without HTTP: fencing + an append
        engine = StreamEngine(StreamsConfig(data_dir=Path(tmp)))
        engine.open()
        engine.create_topic("t", 12)
        engine.create_group("g", "t")
        generation = engine.group("g").join("m", time.monotonic()).generation
        engine_commits = []
        for i in range(commits):
            started = time.perf_counter()
            engine.commit("g", 0, i, "m", generation)
            engine_commits.append(time.perf_counter() - started)
        await engine.close()
    return {
        "commit_engine_p99_us": round(percentile(engine_commits, 0.99) * 1e6, 1),
        "rebalance_http_p50_ms": round(statistics.median(joins) * 1000, 3),
        "rebalance_http_p99_ms": round(percentile(joins, 0.99) * 1000, 3),
        "rebalance_coordinator_us": round(coordinator * 1e6, 1),
        "commit_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "commit_p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
    }


async def ws_subscribers(url: str, count: int, events: int) -> None:
    """Child process: ``count`` WebSocket subscribers; prints latencies (ms) as JSON when done."""
    latencies: list[float] = []
    ready = 0

    async def one(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal ready
        async with session.ws_connect(url.replace("http", "ws") + f"/stream/fanout/ws/s{n}") as ws:
            ready += 1
            if ready == count:
                print("ready", flush=True)
            seen = 0
            async for message in ws:
                frame = msgspec.json.decode(message.data)
                if frame["type"] == "event":
                    latencies.append((time.time() - frame["data"]["t"]) * 1000)
                    seen += 1
                    if seen == events:
                        return

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, n) for n in range(count)))
    print(json.dumps(latencies), flush=True)


async def ws_fanout(url: str, subscribers: int, events: int, processes: int = 2) -> dict[str, Any]:
    """Subscribers spread over ``processes`` client processes (one Python process parses serially)."""
    async with StreamsClient(url) as client:
        await client.create_room("fanout", exist_ok=True)
        children = []
        for n in range(processes):
            share = subscribers // processes + (1 if n < subscribers % processes else 0)
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--ws-child",
                url,
                "--ws-subscribers",
                str(share),
                "--ws-events",
                str(events),
                stdout=subprocess.PIPE,
            )
            children.append(child)
        for child in children:
            assert child.stdout is not None
            assert (await child.stdout.readline()).strip() == b"ready"
        await asyncio.sleep(0.5)  # every socket has finished its replay handshake
        for _ in range(events):
            await client.publish("fanout", "tick", {"t": time.time()})
            await asyncio.sleep(0.02)
        latencies: list[float] = []
        for child in children:
            assert child.stdout is not None
            latencies += json.loads(await child.stdout.read())
            await child.wait()
    return {
        "subscribers": subscribers,
        "client_processes": processes,
        "events": events,
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "max_ms": round(max(latencies), 3),
    }


# --- Redis Streams ---------------------------------------------------------------------------------


def redis_streams(events: int) -> dict[str, float]:
    """redis-py's synchronous client with hiredis: the fastest way Python talks to Redis."""
    import redis

    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is missing: apt-get install redis-server (make bench does it)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    argv = [
        server,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--dir",
        workdir,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        started = time.perf_counter()
        for _ in range(events // BATCH):
            pipe = client.pipeline(transaction=False)
            for _ in range(BATCH):
                pipe.xadd("bench", {"data": DATA})
            pipe.execute()
        append = time.perf_counter() - started
        client.xgroup_create("bench", "g", id="0")
        started = time.perf_counter()
        read = 0
        while read < events:
            answer: Any = client.xreadgroup("g", "c", {"bench": ">"}, count=1000)
            ids = [entry_id for _stream, entries in answer for entry_id, _fields in entries]
            client.xack("bench", "g", *ids)
            read += len(ids)
        consume = time.perf_counter() - started
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"append_per_s": rate(events, append), "consume_per_s": rate(events, consume)}


# --- NATS JetStream --------------------------------------------------------------------------------


async def jetstream(events: int) -> dict[str, float]:
    import nats

    with NatsServer(jetstream=True) as server:
        server.start()
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="BENCH", subjects=["bench"])
        body = DATA.encode()
        started = time.perf_counter()
        for _ in range(events // BATCH):
            for _ in range(BATCH):
                await js.publish_async("bench", body)
            await js.publish_async_completed()
        append = time.perf_counter() - started
        sub = await js.pull_subscribe("bench", durable="c")
        started = time.perf_counter()
        read = 0
        while read < events:
            messages = await sub.fetch(1000, timeout=10)
            for message in messages:
                await message.ack()
            read += len(messages)
        consume = time.perf_counter() - started
        await nc.close()
    return {"append_per_s": rate(events, append), "consume_per_s": rate(events, consume)}


# --- main ------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "events": args.events,
        "payload_bytes": len(DATA),
    }
    with tempfile.TemporaryDirectory() as tmp:
        results["meshplane_engine"] = await meshplane_engine(Path(tmp), args.events)
    with StreamsServerProcess(
        extra_args=("--fsync", "interval", "--fsync-interval-ms", "10", "--max-payload-bytes", "1048576")
    ) as server:
        server.start()
        results["meshplane_http"] = await meshplane_http(server.url, args.events)
        results["groups"] = await group_timings(server.url, rounds=50, commits=2000)
        results["websocket_fanout"] = await ws_fanout(server.url, 100, args.ws_events, processes=2)
    results["redis_streams"] = redis_streams(args.events)
    results["jetstream"] = await jetstream(args.events)
    redis, mesh = results["redis_streams"], results["meshplane_http"]
    results["ratios"] = {
        "append_http_vs_redis_xadd": round(mesh["append_per_s"] / redis["append_per_s"], 2),
        "append_engine_vs_redis_xadd": round(
            results["meshplane_engine"]["append_per_s"] / redis["append_per_s"], 2
        ),
        "consume_http_vs_redis_xreadgroup": round(mesh["consume_per_s"] / redis["consume_per_s"], 2),
        "append_http_vs_jetstream": round(mesh["append_per_s"] / results["jetstream"]["append_per_s"], 2),
        "consume_http_vs_jetstream": round(mesh["consume_per_s"] / results["jetstream"]["consume_per_s"], 2),
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--ws-events", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "streams.json")
    parser.add_argument("--ws-child", help=argparse.SUPPRESS)
    parser.add_argument("--ws-subscribers", type=int, default=100, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ws_child:
        asyncio.run(ws_subscribers(args.ws_child, args.ws_subscribers, args.ws_events))
        return
    results = asyncio.run(run(args))
    print(json.dumps(results, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
