"""Durable streams benchmark: meshplane against Redis Streams and NATS JetStream, same run, same machine.

    python bench/streams.py                       # results to bench/results/streams.json
    python bench/streams.py --events 100000
    python bench/streams.py --only storage        # local log vs JetStream R1/R3 (bench/streams_storage.py)

Measured (100-byte payloads, one partition / stream):
- append: meshplane over HTTP (batches of 1000 per request, fsync every 10 ms) and its storage engine
  in-process; Redis XADD pipelined x1000 (appendfsync everysec, Redis's tightest periodic fsync);
  JetStream publish_async (file storage).
- consume: meshplane's bulk fetch (raw records, 1 MiB per request, scanned by the client; also with
  every payload decoded), its JSON consume route (limit 1000) and engine reads; Redis XREADGROUP
  COUNT 1000 + XACK; JetStream pull fetch(1000) + ack.
- consumer groups: rebalance time when a 10th member joins (HTTP round trip and the coordinator
  alone), offset-commit latency p50/p99, each over REST (a request per call) and over the command
  WebSocket (``StreamsClient(channel=True)``); for scale, one Redis round trip (XACK) p50/p99.
- the dashboard's cost: the server's idle CPU, its append rate and its WebSocket fan-out latency
  (50 subscribers) with five dashboards open (five live streams read by another process, as five
  browsers would hold them) against none, in interleaved rounds on one server; the medians of each
  side and their ratio.
- WebSocket fan-out: publish-to-receive latency to 100 WebSocket subscribers in other processes,
  twice: aiohttp subscribers sharing both cores with the server and the publisher (REST), and picows
  subscribers with the server on a core of its own and the publisher on the command WebSocket.
  Subscribers are the clients' cost, not the server's: on this 2-core machine 100 Python WebSocket
  clients take most of the CPU the server needs, which a deployment's subscribers elsewhere would not.
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

import streams_storage
from harness import RESULTS, percentile, rate, write_results
from meshplane.cli.bench import Steps
from meshplane.core.groups import GroupCoordinator
from meshplane.core.streamlog import StoredEvent, decode_event, encode_event
from meshplane.launchers import NatsServer, StreamsServerProcess, free_port
from meshplane.streams.client import StreamsClient
from meshplane.streams.log import PartitionLog
from meshplane.streams.service import StreamsConfig, StreamsService
from streams_http import BATCH, DATA, group_round_trips, meshplane_http

IDLE_SECS = 5.0  # the window in which the server's CPU is measured with nothing else going on
DEFAULT_OUT = RESULTS / "streams.json"


# --- meshplane -------------------------------------------------------------------------------------


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
    results: dict[str, float] = {}
    for channel in (False, True):
        results.update(await group_round_trips(url, channel, rounds, commits))
    group = GroupCoordinator("g", "t", 12, strategy="sticky")
    for i in range(9):
        group.join(f"m{i}", 0)
    started = time.perf_counter()
    for _ in range(1000):
        group.join("m9", 0)
        group.leave("m9", 0)
    coordinator = (time.perf_counter() - started) / 2000
    with tempfile.TemporaryDirectory() as tmp:  # the commit path without HTTP: fencing + an append
        engine = StreamsService(StreamsConfig(data_dir=Path(tmp)))
        engine.open()
        await engine.create_topic("t", 12)
        await engine.create_group("g", "t")
        generation = engine.group("g").join("m", time.monotonic()).generation
        engine_commits = []
        for i in range(commits):
            started = time.perf_counter()
            await engine.commit("g", 0, i, "m", generation)
            engine_commits.append(time.perf_counter() - started)
        await engine.close()
    results["commit_engine_p99_us"] = round(percentile(engine_commits, 0.99) * 1e6, 1)
    results["rebalance_coordinator_us"] = round(coordinator * 1e6, 1)
    return results


def ws_subscribers(url: str, count: int, events: int, client: str) -> None:
    """Child process: ``count`` WebSocket subscribers; prints latencies (ms) as JSON when done."""
    latencies: list[float] = []
    urls = [url.replace("http", "ws") + f"/stream/fanout/ws/{client}-{n}" for n in range(count)]

    def received(data: bytes | str) -> bool:
        frame = msgspec.json.decode(data)
        if frame["type"] == "event":
            latencies.append((time.time() - frame["data"]["t"]) * 1000)
            return True
        return False

    async def with_aiohttp() -> None:
        async def one(session: aiohttp.ClientSession, ws_url: str, ready: asyncio.Future[None]) -> None:
            async with session.ws_connect(ws_url) as ws:
                ready.set_result(None)
                seen = 0
                async for message in ws:
                    seen += received(message.data)
                    if seen == events:
                        return

        async with aiohttp.ClientSession() as session:
            readies = [asyncio.get_running_loop().create_future() for _ in urls]
            tasks = [asyncio.create_task(one(session, u, r)) for u, r in zip(urls, readies, strict=True)]
            await asyncio.gather(*readies)
            print("ready", flush=True)
            await asyncio.gather(*tasks)

    async def with_picows() -> None:
        import picows

        done = asyncio.get_running_loop().create_future()
        finished = 0

        class Subscriber(picows.WSListener):
            seen = 0

            def on_ws_frame(self, transport: picows.WSTransport, frame: picows.WSFrame) -> None:
                nonlocal finished
                if frame.msg_type == picows.WSMsgType.TEXT and received(frame.get_payload_as_bytes()):
                    self.seen += 1
                    if self.seen == events:
                        finished += 1
                        if finished == count:
                            done.set_result(None)

        connections = [await picows.ws_connect(Subscriber, u) for u in urls]
        print("ready", flush=True)
        await done
        for transport, _ in connections:
            transport.disconnect()

    asyncio.run(with_picows() if client == "picows" else with_aiohttp())
    print(json.dumps(latencies), flush=True)


async def ws_fanout(
    url: str,
    subscribers: int,
    events: int,
    *,
    client: str,
    channel: bool,
    processes: int = 2,
) -> dict[str, Any]:
    """Subscribers spread over ``processes`` client processes (one Python process parses serially)."""
    async with StreamsClient(url, channel=channel) as publisher:
        await publisher.create_room("fanout", exist_ok=True)
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
                "--ws-client",
                client,
                stdout=subprocess.PIPE,
            )
            children.append(child)
        for child in children:
            assert child.stdout is not None
            assert (await child.stdout.readline()).strip() == b"ready"
        await asyncio.sleep(0.5)  # every socket has finished its replay handshake
        for _ in range(events):
            await publisher.publish("fanout", "tick", {"t": time.time()})
            await asyncio.sleep(0.02)
        latencies: list[float] = []
        for child in children:
            assert child.stdout is not None
            latencies += json.loads(await child.stdout.read())
            await child.wait()
    assert len(latencies) == subscribers * events
    return {
        "subscribers": subscribers,
        "subscriber_client": client,
        "client_processes": processes,
        "publish_over": "command WebSocket" if channel else "REST",
        "events": events,
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "max_ms": round(max(latencies), 3),
    }


async def fanout_variants(server: StreamsServerProcess, events: int) -> dict[str, Any]:
    shared = await ws_fanout(server.url, 100, events, client="aiohttp", channel=False)
    own_cores = os.sched_getaffinity(0)
    if len(own_cores) < 2:
        return {"shared_cores": shared}
    server_core, client_core = sorted(own_cores)[:2]
    os.sched_setaffinity(server.pid, {server_core})
    os.sched_setaffinity(0, {client_core})  # the publisher and, inherited, the subscriber processes
    try:
        own = await ws_fanout(server.url, 100, events, client="picows", channel=True)
    finally:
        os.sched_setaffinity(0, own_cores)
        os.sched_setaffinity(server.pid, own_cores)
    own["server_core"], own["client_core"] = server_core, client_core
    return {"shared_cores": shared, "server_on_own_core": own}


# --- the dashboard's cost ---------------------------------------------------------------------------


def dashboard_readers(url: str, count: int) -> None:
    """Child process: ``count`` dashboards' live streams, read until the parent kills it."""

    async def read_one(session: aiohttp.ClientSession) -> int:
        frames = 0
        async with session.get(url + "/ui/api/live") as response:
            async for _ in response.content.iter_any():
                frames += 1
        return frames

    async def all_of_them() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            tasks = [asyncio.create_task(read_one(session)) for _ in range(count)]
            await asyncio.sleep(1.5)  # every stream has had its first state
            print("ready", flush=True)
            await asyncio.gather(*tasks)

    asyncio.run(all_of_them())


async def append_rate(url: str, topic: str, events: int) -> float:
    async with StreamsClient(url, timeout=300) as client:
        await client.create_topic(topic, 1)
        batch = [{"event_type": "bench", "data": DATA} for _ in range(BATCH)]
        started = time.perf_counter()
        for _ in range(events // BATCH):
            await client.publish_batch(topic, batch, partition=0)
        elapsed = time.perf_counter() - started
        await client.delete_topic(topic)
    return rate(events, elapsed)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def open_dashboards(url: str, count: int) -> asyncio.subprocess.Process:
    readers = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--dashboard-child", url, "--dashboards", str(count), stdout=subprocess.PIPE
    )
    assert readers.stdout is not None
    assert (await readers.stdout.readline()).strip() == b"ready"
    return readers


async def dashboard_cost(
    server: StreamsServerProcess, rounds: int, events: int, ws_events: int, steps: Steps
) -> dict[str, Any]:
    """The server's CPU while idle, its append rate and its fan-out p50, with 0 and with 5 dashboards
    open, alternating, ``rounds`` times each."""
    url, pid = server.url, server.pid
    measured: dict[int, dict[str, list[float]]] = {
        n: {"append": [], "fanout_p50": [], "idle_cpu_percent": []} for n in (0, 5)
    }
    for round_number in range(rounds):
        for dashboards in (0, 5) if round_number % 2 == 0 else (5, 0):
            readers = await open_dashboards(url, dashboards) if dashboards else None
            try:
                side = measured[dashboards]
                before, started = cpu_seconds(pid), time.monotonic()
                await asyncio.sleep(IDLE_SECS)
                used = (cpu_seconds(pid) - before) / (time.monotonic() - started)
                side["idle_cpu_percent"].append(round(used * 100, 2))
                side["append"].append(await append_rate(url, f"dash{round_number}-{dashboards}", events))
                fanout = await ws_fanout(url, 50, ws_events, client="aiohttp", channel=False)
                side["fanout_p50"].append(fanout["p50_ms"])
                async with StreamsClient(url) as client:
                    await client.delete_room("fanout")  # the next round's subscribers start empty
            finally:
                if readers is not None:
                    readers.kill()
                    await readers.wait()
            steps.step(f"dashboard cost: {dashboards} dashboards, round {round_number + 1}/{rounds}")
    median = {n: {k: statistics.median(v) for k, v in sides.items()} for n, sides in measured.items()}
    return {
        "rounds": rounds,
        "append_events": events,
        "fanout_subscribers": 50,
        "fanout_events": ws_events,
        "runs": {str(n): sides for n, sides in measured.items()},
        "none": median[0],
        "five": median[5],
        "idle_cpu_points_five_minus_none": round(
            median[5]["idle_cpu_percent"] - median[0]["idle_cpu_percent"], 2
        ),
        "append_five_vs_none": round(median[5]["append"] / median[0]["append"], 3),
        "fanout_p50_five_vs_none": round(median[5]["fanout_p50"] / median[0]["fanout_p50"], 3),
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
        entries: Any = client.xrange("bench", count=2000)
        ids = [entry_id for entry_id, _fields in entries]
        round_trips = []
        for entry_id in ids:  # one command, one answer: what an offset commit is to a broker
            started = time.perf_counter()
            client.xack("bench", "g", entry_id)
            round_trips.append(time.perf_counter() - started)
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "append_per_s": rate(events, append),
        "consume_per_s": rate(events, consume),
        "xack_round_trip_p50_ms": round(statistics.median(round_trips) * 1000, 3),
        "xack_round_trip_p99_ms": round(percentile(round_trips, 0.99) * 1000, 3),
    }


# --- NATS JetStream --------------------------------------------------------------------------------


async def jetstream(events: int) -> dict[str, float]:
    with NatsServer(jetstream=True) as server:
        return await streams_storage.raw_jetstream([server.start().url], 1, events)


# --- main ------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "events": args.events,
        "payload_bytes": len(DATA),
    }
    if args.only == "storage":
        return {**results, **await streams_storage.run(args.events)}
    if args.only == "dashboard":
        steps = Steps(2 * args.dashboard_rounds)
        with StreamsServerProcess(extra_args=("--fsync", "interval", "--fsync-interval-ms", "10")) as server:
            server.start()
            cost = await dashboard_cost(
                server, args.dashboard_rounds, args.events // 4, args.ws_events // 2, steps
            )
        return {**results, "dashboard_cost": cost}
    steps = Steps(6 + 2 * args.dashboard_rounds)
    with tempfile.TemporaryDirectory() as tmp:
        results["meshplane_engine"] = await meshplane_engine(Path(tmp), args.events)
    steps.step("meshplane engine append and reads")
    with StreamsServerProcess(
        extra_args=("--fsync", "interval", "--fsync-interval-ms", "10", "--max-payload-bytes", "1048576")
    ) as server:
        server.start()
        results["meshplane_http"] = await meshplane_http(server.url, args.events)
        steps.step("meshplane over HTTP")
        results["groups"] = await group_timings(server.url, rounds=50, commits=2000)
        steps.step("consumer groups: rebalance and commit latency")
        results["websocket_fanout"] = await fanout_variants(server, args.ws_events)
        steps.step("WebSocket fan-out")
        results["dashboard_cost"] = await dashboard_cost(
            server, args.dashboard_rounds, args.events // 4, args.ws_events // 2, steps
        )
    results["redis_streams"] = redis_streams(args.events)
    steps.step("Redis Streams")
    results["jetstream"] = await jetstream(args.events)
    steps.step("NATS JetStream")
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
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--dashboard-rounds", type=int, default=10, help="rounds of each side (default 10)")
    parser.add_argument(
        "--only",
        choices=["dashboard", "storage"],
        help="only the dashboard's cost (results to bench/results/streams_dashboard.json), or only "
        "the storage backends: local log, JetStream R1 and R3, raw JetStream (streams_storage.json)",
    )
    parser.add_argument("--ws-child", help=argparse.SUPPRESS)
    parser.add_argument("--dashboard-child", help=argparse.SUPPRESS)
    parser.add_argument("--dashboards", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--ws-subscribers", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--ws-client", default="aiohttp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ws_child:
        ws_subscribers(args.ws_child, args.ws_subscribers, args.ws_events, args.ws_client)
        return
    if args.dashboard_child:
        dashboard_readers(args.dashboard_child, args.dashboards)
        return
    if args.only and args.out == DEFAULT_OUT:
        args.out = args.out.with_name(f"streams_{args.only}.json")
    results = asyncio.run(run(args))
    print(json.dumps(results, indent=2))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
