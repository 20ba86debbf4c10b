"""A Spark driver for the crash tests: copies topic IN to topic OUT through the meshplane source and
sink on a checkpoint, a few hundred events a micro-batch, until it is killed.

    python -m tests.spark_copy_driver URL IN OUT CHECKPOINT
"""

from __future__ import annotations

import sys

from meshplane.spark.pipeline import spark_session


def main(url: str, source: str, sink: str, checkpoint: str) -> None:
    spark = spark_session("meshplane-crash-test")
    query = (
        spark.readStream.format("meshplane")
        .option("url", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxEventsPerTrigger", "300")
        .load()
        .selectExpr("key", "value", "'copied' AS event_type")
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
    main(*sys.argv[1:5])
