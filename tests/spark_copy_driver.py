"""A Spark driver for the crash tests: copies topic IN to topic OUT through the meshplane source and
sink on a checkpoint, PER_BATCH events a micro-batch (default 300), until it is killed; with
``shuffle``, through ``repartition(2, "key")`` (a task run again receives its rows in another order).

    [MESHPLANE_SPARK_MASTER=spark://HOST:PORT] python -m tests.spark_copy_driver URL IN OUT CHECKPOINT \\
        [PER_BATCH [shuffle]]
"""

from __future__ import annotations

import sys

from meshplane.spark.pipeline import spark_session


def main(url: str, source: str, sink: str, checkpoint: str, per_batch: str = "300", *how: str) -> None:
    spark = spark_session("meshplane-crash-test")
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
    query = (
        rows.selectExpr("key", "value", "'copied' AS event_type")
        .writeStream.format("meshplane")
        .option("url", url)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:])
