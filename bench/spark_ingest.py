"""Spark ingest benchmark: rows/s from a meshplane topic into Spark, against Parquet, same run.

    python bench/spark_ingest.py                  # 1 M events, 4 partitions, local[2]

Every read is materialised with the ``noop`` sink (all columns produced, nothing written). The
ceiling is Spark reading the same events from a Parquet file. meshplane is read twice: as configured
by default (the executors share the server's host here, so they read its segment files: ``localReads``)
and with ``localReads=false`` (every chunk over HTTP, as executors on other hosts read). The other
comparisons are the same source yielding Python tuples instead of Arrow record batches, a Python
data source that does no work at all (it yields one pre-built Arrow batch of the same schema over and
over): what any Python source can reach here, and the same rows from a JVM source that does no work
(``spark_jvm/NoWorkSource.java``, Spark's DataSource V2, compiled with javac for the run): what a reader
in the JVM could reach. The reads take turns, round after round (7 by default); rates are
medians, and the Arrow/Parquet ratio is the median of the rounds' ratios, each listed. All of it runs
twice, each time in a fresh process: with Spark's Python workers on Unix sockets (``spark_session()``'s
setting), then on Spark's default loopback TCP.

A second method, as a Kafka user compares: the same rows as a stream with Trigger.AvailableNow into
``noop``, from ``readStream.format("meshplane")`` against ``readStream.parquet`` of the same file, wall
clock from ``start()`` to the end of ``awaitTermination()`` (a fresh checkpoint each run), in the same
rounds (``available_now_vs_parquet``); the batch read above is the method's other half. The stream
pair and the batch pair run again on a topic of 200,000 events (``--small-events``, the size issue 37
compared at), where a query's fixed start-up cost weighs more (``available_now_vs_parquet_small``,
``arrow_vs_parquet_small``).

Events are published in two styles, 1 M each, and read in the same rounds: a 96-byte JSON object's text
(``ingest``) and the same object posted as an object (``ingest-json``: what a Python service posting
dicts stores, a msgpack map), which read back as the same ``value`` bytes (checked). The ratios
``text_*`` and ``json_objects_*`` put them side by side. ``--core`` runs only those reads and their
Parquet ceilings, each round's ratios listed under ``rounds`` (write it elsewhere than the full run's
file with ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from harness import add_out, write_results
from meshplane.cli.bench import Steps
from meshplane.launchers import StreamsServerProcess
from meshplane.spark.decode import ARROW_SCHEMA, spark_schema
from meshplane.spark.pipeline import spark_session
from meshplane.streams.client import StreamsClient

PARTITIONS = 4
CORE_RUNS = (
    "parquet",
    "meshplane_arrow",
    "meshplane_json",
    "stream_parquet",
    "stream_meshplane_arrow",
    "stream_meshplane_json",
)
JVM_NO_WORK_SOURCE = "meshplane.bench.NoWorkSource"
TRANSPORTS = ("unix_socket", "tcp")


def event_data(i: int, style: str) -> Any:
    """What a service posts: a 96-byte JSON object, as its text (``text``) or as the object (``json``: a
    Python service posting dicts; stored as a msgpack map). Both read back as the same ``value`` bytes."""
    data = {"user": f"u{i % 1000:03}", "action": "page_view", "page": "/products/4567", "ms": 12.5}
    data |= {"items": [1, 2, 3], "ok": True}
    return data if style == "json" else json.dumps(data, separators=(",", ":"))


async def publish(url: str, topic: str, events: int, style: str = "text") -> None:
    async with StreamsClient(url, timeout=300) as client:
        await client.create_topic(topic, PARTITIONS)
        batch = [
            {"event_type": "bench", "key": f"k{i % 100}", "data": event_data(i, style)} for i in range(1000)
        ]
        for _ in range(events // 1000):
            await client.publish_batch(topic, batch)


class _PrebuiltReader(DataSourceReader):
    def __init__(self, events: int) -> None:
        self.events = events

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(p) for p in range(PARTITIONS)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from meshplane.spark.decode import Columns, to_arrow

        n = 30_000
        cols = Columns(
            [f"k{i % 100}" for i in range(n)],
            [b"x" * 100] * n,
            list(range(n)),
            [10**15] * n,
            ["bench"] * n,
            ["0" * 24] * n,
            [[]] * n,
        )
        batch = to_arrow(cols, "ingest", 0)
        left = self.events // PARTITIONS
        while left > 0:
            yield batch.slice(0, min(n, left))
            left -= n


class PrebuiltSource(DataSource):
    """A Python data source that does no work: the ceiling of the Python Data Source API here."""

    @classmethod
    def name(cls) -> str:
        return "prebuilt"

    def schema(self) -> str:
        return spark_schema(ARROW_SCHEMA)

    def reader(self, schema: Any) -> DataSourceReader:
        return _PrebuiltReader(int(self.options["events"]))


def compile_jvm_source(into: Path) -> Path:
    """``spark_jvm/NoWorkSource.java`` compiled against this PySpark's jars: a class folder for the
    driver's class path (local mode: the executors run in the driver's JVM)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    source = Path(__file__).with_name("spark_jvm") / "NoWorkSource.java"
    subprocess.run(["javac", "-nowarn", "-cp", f"{jars}/*", "-d", str(into), str(source)], check=True)
    return into


def timed_rounds(runs: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Seconds per run: three warm-ups each (the JVM's JIT), then ``repeats`` rounds of every run in
    turn, so that this machine's drift (10-20% over minutes) falls on all of them alike and ratios pair
    runs of one round."""
    for _ in range(3):
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return times


def measure(
    spark: Any, url: str, parquet: str, sizes: dict[str, int], repeats: int, tuples: bool, core: bool
) -> dict[str, Any]:
    """Rates and ratios of one session: each topic (``sizes``: events by topic) is written to Parquet,
    then the reads take turns, round after round. ``ingest-json`` holds the rows of ``ingest`` posted
    as JSON objects: the same values, so Parquet's reads of ``ingest`` are its ceiling too. ``core``:
    only the text and JSON-object reads and their Parquet ceilings."""

    def source(arrow: bool, local_reads: bool = True, topic: str = "ingest") -> Any:
        return (
            spark.read.format("meshplane")
            .option("url", url)
            .option("topic", topic)
            .option("arrow", str(arrow).lower())
            .option("localReads", str(local_reads).lower())
            .load()
        )

    for topic, count in sizes.items():
        source(True, topic=topic).write.parquet(f"{parquet}-{topic}")
        assert spark.read.parquet(f"{parquet}-{topic}").count() == count
    same = ["partition", "offset", "value"]  # both styles read back as the same values
    text, objects = (spark.read.parquet(f"{parquet}-{t}").select(same) for t in ("ingest", "ingest-json"))
    assert text.exceptAll(objects).count() == 0
    events = sizes["ingest"]
    checkpoints = tempfile.mkdtemp(prefix="meshplane-bench-checkpoints-")

    def available_now(frame: Any) -> None:
        checkpoint = tempfile.mkdtemp(dir=checkpoints)
        query = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def stream_parquet(topic: str) -> Any:
        path = f"{parquet}-{topic}"
        return spark.readStream.schema(spark.read.parquet(path).schema).parquet(path)

    def stream_meshplane(topic: str) -> Any:
        stream = spark.readStream.format("meshplane").option("url", url).option("subscribe", topic)
        return stream.option("startingOffsets", "earliest").load()

    runs = {
        "stream_parquet": lambda: available_now(stream_parquet("ingest")),
        "stream_meshplane_arrow": lambda: available_now(stream_meshplane("ingest")),
        "stream_meshplane_json": lambda: available_now(stream_meshplane("ingest-json")),
        "stream_parquet_small": lambda: available_now(stream_parquet("ingest-small")),
        "stream_meshplane_arrow_small": lambda: available_now(stream_meshplane("ingest-small")),
        "parquet": lambda: (
            spark.read.parquet(f"{parquet}-ingest").write.format("noop").mode("overwrite").save()
        ),
        "meshplane_arrow": lambda: source(True).write.format("noop").mode("overwrite").save(),
        "meshplane_json": lambda: (
            source(True, topic="ingest-json").write.format("noop").mode("overwrite").save()
        ),
        "parquet_small": lambda: (
            spark.read.parquet(f"{parquet}-ingest-small").write.format("noop").mode("overwrite").save()
        ),
        "meshplane_arrow_small": lambda: (
            source(True, topic="ingest-small").write.format("noop").mode("overwrite").save()
        ),
        "meshplane_arrow_over_http": lambda: (
            source(True, local_reads=False).write.format("noop").mode("overwrite").save()
        ),
        "python_source_doing_nothing": lambda: (
            spark.read.format("prebuilt")
            .option("events", events)
            .load()
            .write.format("noop")
            .mode("overwrite")
            .save()
        ),
        "jvm_source_doing_nothing": lambda: (
            spark.read.format(JVM_NO_WORK_SOURCE)
            .option("events", events)
            .load()
            .write.format("noop")
            .mode("overwrite")
            .save()
        ),
    }
    if core:
        runs = {k: v for k, v in runs.items() if k in CORE_RUNS}
    rounds = timed_rounds(runs, repeats)
    if tuples and not core:
        rounds.update(
            timed_rounds(
                {"meshplane_tuples": lambda: source(False).write.format("noop").mode("overwrite").save()},
                max(1, repeats - 2),
            )
        )
    rates = {
        k: round(sizes["ingest-small" if k.endswith("_small") else "ingest"] / statistics.median(v))
        for k, v in rounds.items()
    }
    if core:
        return {"rows_per_s": rates, "ratios": json_ratios(rounds), "rounds": json_ratios(rounds, each=True)}

    def per_round(read: str, ceiling: str = "parquet") -> list[float]:
        return [p / m for p, m in zip(rounds[ceiling], rounds[read], strict=True)]

    ratios = {
        "available_now_vs_parquet": round(
            statistics.median(per_round("stream_meshplane_arrow", "stream_parquet")), 2
        ),
        "available_now_vs_parquet_small": round(
            statistics.median(per_round("stream_meshplane_arrow_small", "stream_parquet_small")), 2
        ),
        "arrow_vs_parquet": round(statistics.median(per_round("meshplane_arrow")), 2),
        "arrow_vs_parquet_small": round(
            statistics.median(per_round("meshplane_arrow_small", "parquet_small")), 2
        ),
        "arrow_over_http_vs_parquet": round(statistics.median(per_round("meshplane_arrow_over_http")), 2),
        "python_source_ceiling_vs_parquet": round(rates["python_source_doing_nothing"] / rates["parquet"], 2),
        "jvm_source_ceiling_vs_parquet": round(rates["jvm_source_doing_nothing"] / rates["parquet"], 2),
        "arrow_vs_python_source_ceiling": round(
            rates["meshplane_arrow"] / rates["python_source_doing_nothing"], 2
        ),
    }
    ratios |= json_ratios(rounds)
    if tuples:
        ratios["arrow_vs_tuples"] = round(rates["meshplane_arrow"] / rates["meshplane_tuples"], 2)
    return {
        "rows_per_s": rates,
        "arrow_vs_parquet_per_round": [round(r, 3) for r in per_round("meshplane_arrow")],  # in the order run
        "ratios": ratios,
    }


def json_ratios(rounds: dict[str, list[float]], each: bool = False) -> dict[str, Any]:
    """The publishing styles side by side: each read's median of its rounds' ratios to Parquet (with
    ``each``, every round's, in the order run: their spread)."""

    def ratio(read: str, ceiling: str) -> Any:
        ratios = [p / m for p, m in zip(rounds[ceiling], rounds[read], strict=True)]
        return [round(r, 3) for r in ratios] if each else round(statistics.median(ratios), 2)

    return {
        "text_batch_vs_parquet": ratio("meshplane_arrow", "parquet"),
        "json_objects_batch_vs_parquet": ratio("meshplane_json", "parquet"),
        "text_available_now_vs_parquet": ratio("stream_meshplane_arrow", "stream_parquet"),
        "json_objects_available_now_vs_parquet": ratio("stream_meshplane_json", "stream_parquet"),
    }


def measure_in_this_process(
    url: str, transport: str, sizes: dict[str, int], repeats: int, core: bool
) -> dict[str, Any]:
    unix = transport == "unix_socket"
    spark = spark_session("meshplane-bench", python_over_unix_socket=unix)
    spark.dataSource.register(PrebuiltSource)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return measure(spark, url, str(Path(tmp) / "parquet"), sizes, repeats, unix, core)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--small-events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--core",
        action="store_true",
        help="only the text and JSON-object reads (batch and AvailableNow) against Parquet",
    )
    add_out(parser, "spark_ingest")
    parser.add_argument("--url", help=argparse.SUPPRESS)  # set for the child measuring one transport
    parser.add_argument("--transport", choices=TRANSPORTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.transport:
        sizes = {"ingest": args.events, "ingest-json": args.events}
        if not args.core:
            sizes["ingest-small"] = args.small_events
        result = measure_in_this_process(args.url, args.transport, sizes, args.repeats, args.core)
        args.out.write_text(json.dumps(result))
        return
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "events": args.events,
        "small_events": args.small_events,
        "partitions": PARTITIONS,
        "master": "local[2]",
        "publishing_styles": {
            "text": "a 96-byte JSON object's text",
            "json": "the same object (a msgpack map)",
        },
        "core_only": args.core,
    }
    steps = Steps(1 + len(TRANSPORTS))
    with StreamsServerProcess() as server, tempfile.TemporaryDirectory() as tmp:
        classes = compile_jvm_source(Path(tmp) / "classes")
        server.start()
        asyncio.run(publish(server.url, "ingest", args.events))
        asyncio.run(publish(server.url, "ingest-json", args.events, "json"))
        if not args.core:
            asyncio.run(publish(server.url, "ingest-small", args.small_events))
        steps.step(f"{args.events:,} events in each publishing style (and {args.small_events:,}) published")
        # Spark's Python workers over Unix sockets (spark_session()'s setting), then over Spark's
        # default, loopback TCP: each in a fresh process, so neither starts with the other's warm JVM.
        for transport in TRANSPORTS:
            out = Path(tmp) / f"{transport}.json"
            child = [sys.executable, __file__, "--url", server.url, "--transport", transport]
            child += ["--out", str(out), "--events", str(args.events), "--repeats", str(args.repeats)]
            child += ["--small-events", str(args.small_events), *(["--core"] if args.core else [])]
            submit = f"--driver-class-path {classes} pyspark-shell"  # read when PySpark starts the JVM
            subprocess.run(child, check=True, env={**os.environ, "PYSPARK_SUBMIT_ARGS": submit})
            results[f"python_workers_over_{transport}"] = json.loads(out.read_text())
            steps.step(f"Spark ingest, Python workers over {transport}")
    print(json.dumps(results, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results)


if __name__ == "__main__":
    main()
