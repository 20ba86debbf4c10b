"""A Spark driver for the cluster test: reads topic IN, shuffles it (``repartition(2, "key")``) and
writes it through the meshplane sink to topic OUT on a checkpoint, until it is killed.

    MESHPLANE_SPARK_MASTER=spark://HOST:PORT \
        python -m tests.spark_cluster_driver URL IN OUT CHECKPOINT PER_BATCH
"""

from __future__ import annotations

import sys

from meshplane.spark.pipeline import spark_session


def main(url: str, source: str, sink: str, checkpoint: str, per_batch: str) -> None:
    spark = spark_session("meshplane-cluster-test")
    query = (
        spark.readStream.format("meshplane")
        .option("url", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
        .load()
        .repartition(2, "key")  # a shuffle: a task run again receives its rows in another order
        .selectExpr("key", "value")
        .writeStream.format("meshplane")
        .option("url", url)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])
