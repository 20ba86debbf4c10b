"""``meshplane pipeline demo``: the example Spark pipeline over meshplane streams."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

from meshplane import context
from meshplane.cli.errors import CliError
from meshplane.cli.options import add_token_option
from meshplane.streams.errors import StreamError

DEMO_BASE_TIME = 1_767_225_600.0  # 2026-01-01T00:00:00Z: synthetic event times, so windows are reproducible


def add_pipeline_options(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    demo = actions.add_parser(
        "demo",
        help="count events per key over event-time windows; write Parquet and a topic",
        description="Read a meshplane topic with Spark Structured Streaming, count events per key in "
        "tumbling event-time windows with a watermark, and write the closed windows to Parquet and to "
        "another topic, checkpointed (a rerun resumes exactly). Without --url it starts its own streams "
        "server and publishes synthetic events first.",
    )
    demo.add_argument(
        "--url",
        default=None,
        help="a running streams server (e.g. the one `meshplane up` "
        "prints); default: start one in --state-dir",
    )
    add_token_option(demo, "MESHPLANE_STREAMS_TOKEN", "bearer token of the server")
    demo.add_argument("--source", default="demo-events", help="topic to read (default demo-events)")
    demo.add_argument(
        "--sink", default="demo-windows", help="topic the window counts go to (default demo-windows)"
    )
    demo.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".meshplane"),
        help="where the output, checkpoints and an embedded server's data go (default ./.meshplane)",
    )
    demo.add_argument(
        "--publish",
        type=int,
        default=2000,
        metavar="N",
        help="synthetic events to publish first when the pipeline starts its own server (default 2000)",
    )
    demo.add_argument("--window", default="10 seconds", help="window length (default '10 seconds')")
    demo.add_argument(
        "--watermark", default="10 seconds", help="how late events may be (default '10 seconds')"
    )
    demo.add_argument(
        "--follow",
        type=float,
        default=0.0,
        metavar="S",
        help="keep running for S seconds with a 5 s trigger (default 0: process what is there, stop)",
    )


async def prepare_demo(
    url: str, token: str | None, source: str, sink: str, publish: int, first: int = 0
) -> None:
    """Create the topics if needed and publish ``publish`` synthetic events numbered from ``first``."""
    from meshplane.streams.client import StreamsClient

    async with StreamsClient(url, token=token) as client:
        topics = await client.topics()
        if source not in topics:
            await client.create_topic(source, 4)
        if sink not in topics:
            await client.create_topic(sink, 2)
        for start in range(first, first + publish, 1000):
            batch = [
                {
                    "event_type": "demo",
                    "key": f"worker-{i % 4}",
                    "data": {"at": DEMO_BASE_TIME + i * 0.05, "i": i},
                }
                for i in range(start, min(first + publish, start + 1000))
            ]
            await client.publish_batch(source, batch)


def run_pipeline_command(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pyspark") is None:
        raise CliError("the pipeline runs on Spark: pip install 'meshplane[spark]' (and Java 17)")
    import aiohttp

    from meshplane.cli.spark_noise import ChildStderr
    from meshplane.launchers import StreamsServerProcess
    from meshplane.spark.pipeline import PipelineSettings, run_pipeline, spark_session

    state_dir: Path = args.state_dir.resolve()
    server: StreamsServerProcess | None = None
    env = context.environment()  # `meshplane up` selects its context: its streams server is used
    url = args.url or env.get("MESHPLANE_STREAMS_URL")
    args.token = args.token or env.get("MESHPLANE_STREAMS_TOKEN")
    if url is None:
        server = StreamsServerProcess(data_dir=state_dir / "pipeline-streams").start()
        url = server.url
        print(f"pipeline: started a streams server at {url}", flush=True)
    try:
        try:
            asyncio.run(prepare_demo(url, args.token, args.source, args.sink, args.publish if server else 0))
        except aiohttp.ClientConnectorError as exc:
            raise StreamError(f"cannot reach the streams server at {url}: {exc.os_error.strerror}") from None
        settings = PipelineSettings(
            url=url,
            source=args.source,
            sink=args.sink,
            output=state_dir / "pipeline",
            window=args.window,
            watermark=args.watermark,
            once=not args.follow,
            token=args.token,
        )
        print(
            f"pipeline: {args.source} -> windows of {args.window} (watermark {args.watermark}) -> "
            f"{settings.output / 'windows.parquet'} and topic {args.sink}",
            flush=True,
        )
        ChildStderr()  # before Spark's JVM starts, so it and its Python daemon inherit the filter
        spark = spark_session()
        try:
            summary: dict[str, Any] = run_pipeline(spark, settings, duration=args.follow or None)
        finally:
            spark.stop()
        print(json.dumps(summary, default=str, indent=2), flush=True)
    finally:
        if server is not None:
            server.cleanup()
    return 0
