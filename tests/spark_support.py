"""Fixtures and helpers of the Spark tests: a real `meshplane serve` and a real local[2] session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from meshplane.streams.client import StreamsClient


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def publish(url: str, topic: str, first: int, count: int, partitions: int = 4) -> None:
    async with StreamsClient(url) as client:
        if topic not in await client.topics():
            await client.create_topic(topic, partitions)
        events = [
            {"event_type": "order", "key": f"customer-{i % 13}", "data": {"i": i}}
            for i in range(first, first + count)
        ]
        for start in range(0, len(events), 500):
            await client.publish_batch(topic, events[start : start + 500])


def stored_values(url: str, topic: str) -> list[Any]:
    """The ``i`` of every event's JSON data in ``topic`` (all its partitions), in offset order."""

    async def read_all() -> list[Any]:
        values: list[Any] = []
        async with StreamsClient(url) as client:
            for partition in range((await client.topic_stats(topic))["num_partitions"]):
                offset = 0
                while True:
                    batch = await client.consume_partition(topic, partition, offset, 1000)
                    if not batch["events"]:
                        break
                    values += [json.loads(e["data"])["i"] for e in batch["events"]]
                    offset = batch["events"][-1]["offset"] + 1
        return values

    return list(run(read_all()))


def reader(spark: SparkSession, url: str, topic: str, **options: Any) -> DataFrame:
    stream = spark.readStream.format("meshplane").option("url", url).option("topic", topic)
    for name, value in options.items():
        stream = stream.option(name, value)
    return stream.load()


def collect_available_now(frame: DataFrame, checkpoint: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """Run with Trigger.AvailableNow; returns the rows and the size of each micro-batch."""
    rows: list[dict[str, Any]] = []
    sizes: list[int] = []

    def each(batch: DataFrame, batch_id: int) -> None:
        got = [r.asDict() for r in batch.collect()]
        rows.extend(got)
        sizes.append(len(got))

    query = (
        frame.writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return rows, sizes
