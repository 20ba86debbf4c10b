"""A Spark driver for the crash tests: copies topic IN to topic OUT through the meshplane source and
sink on a checkpoint, PER_BATCH events a micro-batch (default 300), until it is killed; with
``shuffle``, through ``repartition(2, "key")`` (a task run again receives its rows in another order).
Copies separated by ``+`` run as queries of the one driver (one JVM for several servers' copies).

    [MESHPLANE_SPARK_MASTER=spark://HOST:PORT] python -m tests.spark_copy_driver URL IN OUT CHECKPOINT \\
        [PER_BATCH [shuffle]] [+ URL IN OUT CHECKPOINT [PER_BATCH [shuffle]]]...
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from meshplane.spark.pipeline import spark_session


def start_copy(
    spark: Any, url: str, source: str, sink: str, checkpoint: str, per_batch: str = "300", *how: str
) -> None:
    rows = (
        spark.readStream.format("meshplane")
        .option("url", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
        .load()
    )
    if "shuffle" in how:
        rows = rows.repartition(2, "key")
    (
        rows.selectExpr("key", "value", "'copied' AS event_type")
        .writeStream.format("meshplane")
        .option("url", url)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def main(*args: str) -> None:
    spark = spark_session("meshplane-crash-test")
    for plus, copy in itertools.groupby(args, lambda arg: arg == "+"):
        if not plus:
            start_copy(spark, *copy)
    print("started", flush=True)
    spark.streams.awaitAnyTermination()


if __name__ == "__main__":
    main(*sys.argv[1:])
