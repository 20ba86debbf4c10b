"""Where topics live: the local segment log against NATS JetStream (R1 on one node, R3 on three), each
through `meshplane serve`, and raw nats-py JetStream on the same servers; same run, same machine.

    python bench/streams.py --only storage        # results to bench/results/streams_storage.json

Per backend (100-byte payloads, one partition):
- append: ``publish_batch`` of 1000 events a request over HTTP (meshplane, ``meshplane_http`` of
  streams_http.py), ``publish_async`` of 1000 then waiting for their acks (raw JetStream);
- consume: the bulk fetch (raw records, 1 MiB a request; also with every payload decoded) and the
  JSON consume route (meshplane), a pull consumer's ``fetch(1000)`` with an ack each (raw JetStream);
- consumer groups (``group_round_trips`` of streams_http.py): a 10th member joining 9 (a rebalance), and
  commit latency p50/p99, one commit after another, over REST and over the command WebSocket (on
  JetStream each is a compare-and-set of the group's key);
- Spark ingest: rows/s of a batch read of the whole topic into Spark's ``noop`` sink, median of 3
  after a warm-up (one local[2] session for all backends).

Durability differs by design and is part of what is measured: the local log fsyncs every 10 ms;
JetStream acknowledges once a majority holds the message (R3) and fsyncs on its own schedule
(``sync_interval``, 2 minutes by default).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import nats

from meshplane.cli.bench import Steps
from meshplane.launchers import JetStreamCluster, NatsServer, StreamsServerProcess
from streams_http import BATCH, DATA, group_round_trips, meshplane_http

COMMITS = 300


async def through_meshplane(url: str, events: int) -> dict[str, float]:
    """The same measures as bench/streams.py's of the local server: appends, reads, groups."""
    results = await meshplane_http(url, events)
    for channel in (False, True):
        results.update(await group_round_trips(url, channel, rounds=20, commits=COMMITS))
    return results


async def raw_jetstream(urls: list[str], replicas: int, events: int) -> dict[str, float]:
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream(timeout=30)
        await js.add_stream(name="RAW", subjects=["raw"], num_replicas=replicas)
        body = DATA.encode()
        started = time.perf_counter()
        for _ in range(events // BATCH):
            for _ in range(BATCH):
                await js.publish_async("raw", body)
            await js.publish_async_completed()
        append = time.perf_counter() - started
        sub = await js.pull_subscribe("raw", durable="c")
        started = time.perf_counter()
        read = 0
        while read < events:
            messages = await sub.fetch(1000, timeout=10)
            for message in messages:
                await message.ack()
            read += len(messages)
        consume = time.perf_counter() - started
        await js.delete_stream("RAW")
    finally:
        await nc.close()
    return {"append_per_s": round(events / append, 1), "consume_per_s": round(events / consume, 1)}


def spark_ingest(urls: dict[str, str], events: int) -> dict[str, float]:
    from meshplane.spark.pipeline import spark_session

    spark = spark_session("meshplane-bench-storage")
    rates: dict[str, float] = {}
    try:
        for name, url in urls.items():

            def read_all(url: str = url) -> None:
                frame = spark.read.format("meshplane").option("url", url).option("topic", "bench").load()
                frame.write.format("noop").mode("overwrite").save()

            read_all()  # warm-up (and the JVM's JIT)
            times = []
            for _ in range(3):
                started = time.perf_counter()
                read_all()
                times.append(time.perf_counter() - started)
            rates[name] = round(events / statistics.median(times))
    finally:
        spark.stop()
    return rates


async def run(events: int) -> dict[str, Any]:
    steps = Steps(6)
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        local = stack.enter_context(
            StreamsServerProcess(extra_args=("--fsync", "interval", "--fsync-interval-ms", "10"))
        ).start()
        single = stack.enter_context(NatsServer(jetstream=True)).start()
        r1 = stack.enter_context(StreamsServerProcess(extra_args=("--storage", single.url))).start()
        cluster = stack.enter_context(JetStreamCluster(3)).start()
        storage = ("--storage", ",".join(cluster.urls), "--replicas", "3")
        r3 = stack.enter_context(StreamsServerProcess(extra_args=storage)).start()
        servers = {"local": local.url, "jetstream_r1": r1.url, "jetstream_r3": r3.url}
        for name, url in servers.items():
            results[f"meshplane_{name}"] = await through_meshplane(url, events)
            steps.step(f"meshplane on {name}")
        results["raw_jetstream_r1"] = await raw_jetstream([single.url], 1, events)
        results["raw_jetstream_r3"] = await raw_jetstream(cluster.urls, 3, events)
        steps.step("raw nats-py JetStream, R1 and R3")
        results["spark_ingest_rows_per_s"] = spark_ingest(servers, events)
        steps.step("Spark ingest")
    ratios: dict[str, float] = {}
    for replicas in ("r1", "r3"):
        ours, raw = results[f"meshplane_jetstream_{replicas}"], results[f"raw_jetstream_{replicas}"]
        for what in ("append", "consume"):
            ours_rate = ours[f"{what}_per_s"]
            ratios[f"{what}_{replicas}_vs_raw_jetstream"] = round(ours_rate / raw[f"{what}_per_s"], 2)
            ratios[f"{what}_{replicas}_vs_local"] = round(
                ours_rate / results["meshplane_local"][f"{what}_per_s"], 2
            )
    results["ratios"] = ratios
    return results
