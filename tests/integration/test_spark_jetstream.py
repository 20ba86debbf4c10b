"""The Spark sink into a topic replicated three ways on JetStream, through the failures HA exists for:
the JetStream metadata leader, then the leader of a partition written to, are killed (SIGKILL) while
a streaming query copies a topic. The query does not fail, and every row lands once (the sink's
idempotent batches, retried on 503)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError
from pyspark.sql import SparkSession

from meshplane.launchers import JetStreamCluster, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import RequestTimeout, StorageError
from meshplane.streams.jetstream import naming
from tests.helpers import wait_until
from tests.spark_support import publish, reader, run

EVENTS = 20_000


@pytest.fixture
def replicated() -> Iterator[tuple[JetStreamCluster, StreamsServerProcess]]:
    with JetStreamCluster(3) as cluster:
        cluster.start()
        args = ("--storage", ",".join(cluster.urls), "--replicas", "3")
        with StreamsServerProcess(extra_args=args) as server:
            yield cluster, server.start()


def stored(url: str, topic: str, timeout: float = 30.0) -> int:
    """How many events ``topic`` holds, asked until the server answers: while JetStream elects, it
    answers 503 or 504."""
    counts: list[int] = []

    async def count() -> bool:
        async with StreamsClient(url) as client:
            try:
                if topic not in await client.topics():
                    counts.append(0)
                else:
                    stats = await client.topic_stats(topic)
                    counts.append(sum(int(p["message_count"]) for p in stats["partitions"]))
            except (StorageError, RequestTimeout):
                return False
        return True

    wait_until(lambda: bool(run(count())), timeout, 0.2, f"the size of {topic}")
    return counts[-1]


def stream_leader(cluster: JetStreamCluster, stream: str, timeout: float = 60.0) -> str:
    """The node leading ``stream``, asked until one answers: just after a node restarts, the meta group
    may still be electing and STREAM.INFO goes unanswered for a while."""
    leaders: list[str] = []

    async def ask() -> bool:
        try:
            nc = await nats.connect(cluster.urls, connect_timeout=2, max_reconnect_attempts=0)
        except (NatsError, OSError):
            return False
        try:
            info = await nc.jetstream().stream_info(stream)
        except NatsError:
            return False  # no answer yet: asked again
        finally:
            await nc.close()
        if info.cluster is not None and info.cluster.leader:
            leaders.append(info.cluster.leader)
        return bool(leaders)

    wait_until(lambda: bool(run(ask())), timeout, 0.2, f"a leader of {stream}")
    return leaders[0]


@pytest.mark.timeout(560)  # its waits add up to 540 s
def test_a_streaming_sink_copies_every_row_once_while_the_meta_leader_is_killed(
    spark: SparkSession, replicated: tuple[JetStreamCluster, StreamsServerProcess], tmp_path: Path
) -> None:
    cluster, server = replicated
    cluster.wait_meta_leader()
    run(publish(server.url, "js-in", 0, EVENTS, partitions=4))
    query = (
        reader(spark, server.url, "js-in", startingOffsets="earliest", maxOffsetsPerTrigger="1000")
        .selectExpr("key", "value")
        .writeStream.format("meshplane")
        .option("url", server.url)
        .option("topic", "js-out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )

    def copying_while_down(node: str, what: str) -> None:
        cluster.node(node).kill(signal.SIGKILL)
        copied = stored(server.url, "js-out")
        wait_until(lambda: stored(server.url, "js-out") >= copied + 3_000, 60, 0.2, what)
        cluster.node(node).start()

    try:
        wait_until(lambda: stored(server.url, "js-out") >= 3_000, 120, 0.2, "3,000 rows copied")
        copying_while_down(cluster.wait_meta_leader(), "copying with the meta leader killed")
        leader = stream_leader(cluster, naming.partition_stream("js-out", 0))
        copying_while_down(leader, "copying with a partition's leader killed")
        wait_until(lambda: stored(server.url, "js-out") >= EVENTS, 120, 0.2, "every row copied")
        assert query.exception() is None
    finally:
        query.stop()
    rows = spark.read.format("meshplane").option("url", server.url).option("subscribe", "js-out").load()
    values = sorted(json.loads(r["value"])["i"] for r in rows.select("value").collect())
    assert values == list(range(EVENTS))  # every row, once
