"""The example pipeline: events per key over event-time windows, to Parquet and to another topic.

Reads a meshplane topic, takes the event time from the payload's ``at`` field (epoch seconds) when it
has one and from the publish timestamp otherwise, counts events per key in tumbling windows with a
watermark, and writes the closed windows both to Parquet and to a meshplane topic. Each sink has its
own checkpoint under ``output/checkpoints``: a restart resumes exactly where it stopped.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplane.spark import forkserver, register


@dataclass
class PipelineSettings:
    url: str
    source: str
    sink: str
    output: Path
    window: str = "10 seconds"
    watermark: str = "10 seconds"
    once: bool = True
    trigger_interval: str = "5 seconds"
    token: str | None = None


def spark_session(app: str = "meshplane-pipeline", python_over_unix_socket: bool = True) -> Any:
    """A local[2] session (``MESHPLANE_SPARK_MASTER`` to change) whose Python workers run this interpreter
    (through ``meshplane-spark-python``: PySpark imported with its cached bytecode, a second sooner for
    each Python process Spark starts; each streaming query's source runner forked from a fork server
    that imported it all once, ~0.25 s sooner), with ``format("meshplane")`` registered.

    With ``python_over_unix_socket`` (Spark's ``spark.python.unix.domain.socket.enabled``) the JVM and
    its Python workers exchange Arrow batches over Unix sockets instead of loopback TCP: Python sources
    read up to ~20% faster here (bench/spark_ingest.py measures both).
    """
    launcher = Path(sys.executable).with_name("meshplane-spark-python")  # see worker_python.py
    python = str(launcher) if launcher.is_file() else sys.executable
    os.environ.setdefault("PYSPARK_PYTHON", python)
    # the Python processes Spark starts for the driver (Python data sources' lookup and planning) too
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", python)
    if os.environ["PYSPARK_PYTHON"] == str(launcher):
        server = forkserver.start()  # before Spark's JVM starts: it passes the variable on
        if server is not None:
            os.environ[forkserver.ENV] = server
    master = os.environ.get("MESHPLANE_SPARK_MASTER", "local[2]")
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "hostname resolves to loopback" warning
    log_config = os.environ.get("MESHPLANE_SPARK_LOG4J") or str(Path(__file__).with_name("log4j2.properties"))
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(master)
        .appName(app)
        # -Xss: Spark's StreamExecution.PROXY_ERROR regex, ((.|\r\n|\r|\n)*), recurses once per character
        # of a foreachBatch function's Py4J error when query.stop() interrupts it: a long message
        # overflowed the default 1 MiB stack of the stream's thread (a StackOverflowError at stop).
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_config} -Xss16m")
        .config("spark.ui.showConsoleProgress", "false")  # progress bars: noise between a pipeline's lines
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.unix.domain.socket.enabled", str(python_over_unix_socket).lower())
        .config("spark.python.daemon.module", "meshplane.spark.daemon")  # no traceback at stop()
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def windowed_counts(spark: Any, settings: PipelineSettings) -> Any:
    from pyspark.sql import functions as F

    reader = spark.readStream.format("meshplane").option("url", settings.url).option("topic", settings.source)
    if settings.token:
        reader = reader.option("token", settings.token)
    events = reader.option("startingOffsets", "earliest").load()
    at = F.get_json_object(F.col("value").cast("string"), "$.at").cast("double")
    event_time = F.coalesce(F.timestamp_seconds(at), F.col("timestamp"))
    return (
        events.select(
            F.coalesce(F.col("key").cast("string"), F.lit("")).alias("key"), event_time.alias("event_time")
        )
        .withWatermark("event_time", settings.watermark)
        .groupBy(F.window("event_time", settings.window), "key")
        .agg(F.count(F.lit(1)).alias("events"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "key",
            "events",
        )
    )


def run_pipeline(spark: Any, settings: PipelineSettings, duration: float | None = None) -> dict[str, Any]:
    """Run both sinks (until caught up with ``once``, else for ``duration`` seconds); returns a summary."""
    from pyspark.sql import functions as F

    counts = windowed_counts(spark, settings)
    parquet_dir = settings.output / "windows.parquet"
    checkpoints = settings.output / "checkpoints"
    trigger = {"availableNow": True} if settings.once else {"processingTime": settings.trigger_interval}
    to_parquet = (
        counts.writeStream.format("parquet")
        .option("path", str(parquet_dir))
        .option("checkpointLocation", str(checkpoints / "parquet"))
        .outputMode("append")
        .trigger(**trigger)
        .start()
    )
    window = F.struct(  # each window's event holds an object, not JSON text inside JSON
        F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("window_start"),
        F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("window_end"),
        "key",
        "events",
    )
    as_events = counts.select(F.col("key"), window.alias("value"), F.lit("window.count").alias("event_type"))
    writer = (
        as_events.writeStream.format("meshplane")
        .option("url", settings.url)
        .option("topic", settings.sink)
        .option("valueFormat", "json")
    )
    if settings.token:
        writer = writer.option("token", settings.token)
    to_topic = (
        writer.option("checkpointLocation", str(checkpoints / "meshplane"))
        .outputMode("append")
        .trigger(**trigger)
        .start()
    )
    if settings.once:
        to_parquet.awaitTermination()
        to_topic.awaitTermination()
    else:
        to_parquet.awaitTermination(duration)
        to_parquet.stop()
        to_topic.stop()
    windows = spark.read.parquet(str(parquet_dir)) if parquet_dir.exists() else None
    rows = windows.orderBy("window_start", "key").collect() if windows is not None else []
    return {
        "windows": len(rows),
        "events_in_windows": sum(r["events"] for r in rows),
        "parquet": str(parquet_dir),
        "topic": settings.sink,
        "sample": [r.asDict() for r in rows[:5]],
    }
