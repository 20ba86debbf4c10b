"""The Spark data source on a real local[2] Spark session against a real `meshplane serve`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from meshplane.launchers import StreamsServerProcess
from meshplane.spark import forkserver
from meshplane.streams.client import StreamsClient
from tests.helpers import read_until, wait_until
from tests.spark_support import collect_available_now, publish, reader, run
from tests.support.cli import MESHPLANE, clean_env, run_cli

pytestmark = pytest.mark.spark_jvm  # every test here runs Spark (a session, a driver or `up`)


def test_spark_python_workers_import_pyspark_with_its_cached_bytecode(spark: SparkSession) -> None:
    # A zip has no bytecode cache: each Python process Spark starts would compile PySpark anew.
    one = spark.sparkContext.parallelize([0], 1)
    where = one.map(lambda _: str(__import__("pyspark").__file__)).collect()
    assert where[0].endswith("/pyspark/__init__.py")
    assert ".zip" not in where[0]


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_streaming_querys_source_runner_is_forked_from_the_fork_server_and_ends_with_it(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    # Spark starts a Python per streaming query to plan its batches: forked, it skips ~0.25 s of imports.
    forkserver_pid = forkserver.running_pid()
    assert forkserver_pid is not None
    before = set(_children(forkserver_pid))
    run(publish(server.url, "forked", 0, 10))
    query = (
        reader(spark, server.url, "forked", startingOffsets="earliest")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_until(lambda: bool(set(_children(forkserver_pid)) - before), timeout=30, what="a forked runner")
        runners = set(_children(forkserver_pid)) - before

        # The rows may come in the first batch or a later one (a loaded machine), never twice.
        def read() -> int:
            return sum(p["numInputRows"] for p in query.recentProgress)

        wait_until(lambda: read() >= 10, timeout=60, interval=0.05, what="the 10 rows read")
        assert read() == 10
    finally:
        query.stop()
    wait_until(lambda: not runners & set(_children(forkserver_pid)), timeout=30, what="the runner ended")


def test_available_now_reads_exactly_what_was_published_and_resumes(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "orders", 0, 1000))
    frame = reader(spark, server.url, "orders", startingOffsets="earliest")
    rows, _ = collect_available_now(frame, tmp_path / "ckpt")
    assert len(rows) == 1000
    assert sorted(json.loads(r["value"])["i"] for r in rows) == list(range(1000))
    by_partition: dict[int, list[int]] = {}
    for r in rows:
        by_partition.setdefault(r["partition"], []).append(r["offset"])
        assert (r["topic"], r["event_type"]) == ("orders", "order")
        assert r["key"].startswith(b"customer-")
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))  # every offset once, from 0
    run(publish(server.url, "orders", 1000, 300))
    more, _ = collect_available_now(frame, tmp_path / "ckpt")  # restart from the checkpoint
    assert sorted(json.loads(r["value"])["i"] for r in more) == list(range(1000, 1300))


def test_max_events_per_trigger_splits_the_backlog(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "backlog", 0, 1000))
    frame = reader(spark, server.url, "backlog", startingOffsets="earliest", maxEventsPerTrigger=300)
    rows, sizes = collect_available_now(frame, tmp_path / "ckpt")
    assert sizes == [300, 300, 300, 100]
    assert len({(r["partition"], r["offset"]) for r in rows}) == 1000


def test_batch_read_between_offsets(spark: SparkSession, server: StreamsServerProcess) -> None:
    run(publish(server.url, "backfill", 0, 200, partitions=2))
    read: dict[str, list[Any]] = {}
    for local_reads in ("true", "false"):  # the segment files read in place, or every chunk over HTTP
        frame = (
            spark.read.format("meshplane")
            .option("url", server.url)
            .option("topic", "backfill")
            .option("startingOffsets", json.dumps({"backfill": {"0": 10, "1": -2}}))
            .option("endingOffsets", json.dumps({"backfill": {"0": 20, "1": 5}}))
            .option("localReads", local_reads)
            .load()
        )
        read[local_reads] = sorted(frame.collect(), key=lambda r: (r["partition"], r["offset"]))
    assert [(r["partition"], r["offset"]) for r in read["true"]] == [(0, o) for o in range(10, 20)] + [
        (1, o) for o in range(5)
    ]
    assert read["true"] == read["false"]
    past_the_end = json.dumps({"backfill": {"0": 10_000, "1": -1}})
    with pytest.raises(Exception, match=r"endingOffsets lie past the written events: backfill/0 at 10000"):
        spark.read.format("meshplane").option("url", server.url).option("topic", "backfill").option(
            "endingOffsets", past_the_end
        ).load().collect()


def test_events_posted_as_json_objects_read_back_as_the_json_of_their_data(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    """What a Python service posting dicts stores (msgpack maps, lists, numbers) reads, through the
    compiled scan, as the same bytes as the general decoder (tuples) gives: the JSON of the data."""
    datas: list[Any] = [
        {"user": "u1", "ms": 12.5, "items": [1, 2.25, None], "ok": True, "big": 2**60, "é": "\u2028\n"},
        [{"nested": {"deep": [0.1, -0.0, 1e300]}}],
        -7,
        3.5,
        "plain text",
        None,
    ]

    async def post() -> None:
        async with StreamsClient(server.url) as client:
            await client.create_topic("objects", 1)
            await client.publish_batch("objects", [{"event_type": "t", "data": d} for d in datas])

    run(post())
    values = {}
    for arrow in ("true", "false"):  # the compiled scan, the general decoder's tuples
        frame = spark.read.format("meshplane").option("url", server.url).option("topic", "objects")
        rows = frame.option("arrow", arrow).load().collect()
        values[arrow] = [r["value"] for r in sorted(rows, key=lambda r: r["offset"])]
    expected = [
        None if d is None else (d.encode() if isinstance(d, str) else msgspec.json.encode(d)) for d in datas
    ]
    assert values["true"] == values["false"] == expected


def test_retention_gap_fails_or_is_skipped(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    async def setup() -> None:
        async with StreamsClient(server.url) as client:
            await client.create_topic("short", 1, retention_policy={"type": "Messages", "max_messages": 100})
            for start in range(0, 300, 50):
                await client.publish_batch(
                    "short", [{"event_type": "e", "data": i} for i in range(start, start + 50)]
                )

    run(setup())
    from_zero = json.dumps({"short": {"0": 0}})
    failing = reader(spark, server.url, "short", startingOffsets=from_zero)
    with pytest.raises(
        StreamingQueryException, match=r"offsets 0\.\.199 \(200 events\) were deleted by retention"
    ):
        collect_available_now(failing, tmp_path / "fail")
    skipping = reader(spark, server.url, "short", startingOffsets=from_zero, failOnDataLoss="false")
    rows, _ = collect_available_now(skipping, tmp_path / "skip")
    assert sorted(r["offset"] for r in rows) == list(range(200, 300))


def test_sink_lands_every_row_once_even_when_a_batch_is_replayed(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "sink-in", 0, 500, partitions=2))

    async def create_out() -> None:
        async with StreamsClient(server.url) as client:
            await client.create_topic("sink-out", 2)

    run(create_out())
    checkpoint = tmp_path / "sink-ckpt"

    def copy_all() -> None:
        query = (
            reader(spark, server.url, "sink-in", startingOffsets="earliest")
            .selectExpr("key", "value", "'copied' AS event_type")
            .writeStream.format("meshplane")
            .option("url", server.url)
            .option("topic", "sink-out")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def landed() -> list[Any]:
        frame = spark.read.format("meshplane").option("url", server.url).option("topic", "sink-out").load()
        return frame.collect()

    copy_all()
    rows = landed()
    assert len(rows) == 500
    assert sorted(json.loads(r["value"])["i"] for r in rows) == list(range(500))
    assert {r["event_type"] for r in rows} == {"copied"}
    # Forget that batch 0 was committed: Spark runs it again with the same batchId.
    commits = checkpoint / "commits"
    for name in os.listdir(commits):
        (commits / name).unlink()
    skipped_before = duplicates_skipped(server.url)
    copy_all()
    assert duplicates_skipped(server.url) == skipped_before + 500  # batch 0 really ran again...
    assert len(landed()) == 500  # ...and published nothing twice


def duplicates_skipped(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics") as response:
        text = response.read().decode()
    return float(re.search(r"^meshplane_streams_duplicates_skipped_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def test_sink_needs_a_value_column(spark: SparkSession, server: StreamsServerProcess) -> None:
    frame = spark.createDataFrame([("k",)], "key string")
    with pytest.raises(Exception, match="needs a 'value' column"):
        frame.write.format("meshplane").option("url", server.url).option("topic", "x").mode("append").save()
    shutil.rmtree("spark-warehouse", ignore_errors=True)


def test_sink_creates_a_missing_topic_as_kafkas_brokers_do(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    """Issue 35: the README's sink snippet failed with a 404 buried in Spark's query dump."""
    frame = spark.createDataFrame([("k1", "one"), ("k2", "two")], "key string, value string")
    frame.write.format("meshplane").option("url", server.url).option("topic", "made-by-sink").mode(
        "append"
    ).save()

    async def stored() -> list[Any]:
        async with StreamsClient(server.url) as client:
            stats = await client.topic_stats("made-by-sink")
            events = []
            for partition in stats["partitions"]:
                answer = await client.consume_partition("made-by-sink", int(partition["partition_id"]))
                events += answer["events"]
            return sorted(event["data"] for event in events)

    assert run(stored()) == ["one", "two"]
    shutil.rmtree("spark-warehouse", ignore_errors=True)


def test_pipeline_demo_writes_closed_windows_and_resumes_exactly(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    from meshplane.cli.pipeline import prepare_demo
    from meshplane.spark.pipeline import PipelineSettings, run_pipeline

    settings = PipelineSettings(url=server.url, source="pipe-in", sink="pipe-out", output=tmp_path)
    run(prepare_demo(server.url, None, "pipe-in", "pipe-out", 2000))  # 100 s of event time, 4 keys
    first = run_pipeline(spark, settings)
    # 10 s windows, 10 s watermark: max event time 99.95 s, so windows ending by 89.95 s are closed:
    # 8 windows x 4 keys of 50 events.
    assert (first["windows"], first["events_in_windows"]) == (32, 1600)
    run(prepare_demo(server.url, None, "pipe-in", "pipe-out", 1000, first=2000))  # 50 s more
    second = run_pipeline(spark, settings)
    windows = spark.read.parquet(str(tmp_path / "windows.parquet")).collect()
    keys = [(r["window_start"], r["key"]) for r in windows]
    assert len(keys) == len(set(keys)) == second["windows"]  # resumed: no window written twice
    assert all(r["events"] == 50 for r in windows)
    assert second["windows"] == 52  # max event time 149.95 s: 13 closed windows x 4 keys
    published = spark.read.format("meshplane").option("url", server.url).option("topic", "pipe-out").load()
    assert published.count() == second["windows"]  # the topic got each closed window once too

    async def first_window() -> Any:
        async with StreamsClient(server.url) as client:
            for partition in (0, 1):
                events = (await client.consume_partition("pipe-out", partition, 0, 1))["events"]
                if events:
                    return events[0]["data"]
        return None

    data = run(first_window())  # issue 35: it was a JSON string inside the event's JSON
    assert set(data) == {"window_start", "window_end", "key", "events"}
    assert data["events"] == 50
    assert data["window_start"].startswith("2026-01-01T00:0")


def test_new_partitions_are_picked_up(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "growing", 0, 100, partitions=2))
    frame = reader(spark, server.url, "growing", startingOffsets="earliest")
    rows, _ = collect_available_now(frame, tmp_path / "ckpt")
    assert len(rows) == 100

    async def grow_and_publish() -> None:
        async with StreamsClient(server.url) as client:
            await client.add_partitions("growing", 3)
            await client.publish_batch(
                "growing", [{"event_type": "e", "data": i} for i in range(7)], partition=2
            )

    run(grow_and_publish())
    more, _ = collect_available_now(frame, tmp_path / "ckpt")
    assert sorted((r["partition"], r["offset"]) for r in more) == [(2, o) for o in range(7)]


def test_corrupt_records_fail_the_query_or_are_skipped(spark: SparkSession, tmp_path: Path) -> None:
    with StreamsServerProcess() as proc:
        proc.start()
        run(publish(proc.url, "damaged", 0, 300, partitions=1))
        proc.stop()
        segment = sorted((proc.data_dir / "topics" / "damaged" / "0").glob("*.log"))[0]
        data = bytearray(segment.read_bytes())
        position = 0
        for _ in range(100):  # to record 100, header by header
            position += int.from_bytes(data[position : position + 4], "big") + 8
        data[position + 30] ^= 1  # a flipped bit on disk
        segment.write_bytes(bytes(data))
        proc.start()  # recovery finds it: the records after it are kept
        from_zero = json.dumps({"damaged": {"0": 0}})
        failing = reader(spark, proc.url, "damaged", startingOffsets=from_zero)
        with pytest.raises(StreamingQueryException, match=r"offsets 100\.\.100 \(1 events\) were unreadable"):
            collect_available_now(failing, tmp_path / "fail")
        skipping = reader(spark, proc.url, "damaged", startingOffsets=from_zero, failOnDataLoss="false")
        rows, _ = collect_available_now(skipping, tmp_path / "skip")
        assert sorted(r["offset"] for r in rows) == [*range(100), *range(101, 300)]


@pytest.mark.timeout(330)  # the demo's own 300 s bound first
def test_pipeline_demo_prints_its_progress_and_result_not_sparks_noise(tmp_path: Path) -> None:
    result = run_cli(
        "pipeline", "demo", "--state-dir", str(tmp_path), env=clean_env(("MESHPLANE_",)), timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "pipeline: demo-events -> windows of 10 seconds" in result.stdout
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["windows"] > 0
    # no progress bars, WARN lines, log4j notices, nor PySpark's daemon's traceback at shutdown
    assert result.stderr == ""


ONE_SESSION_STOPPED = """
from meshplane.spark.pipeline import spark_session
spark = spark_session("stopped")
frozen = lambda _: [__import__("gc").get_freeze_count()]
print(min(spark.sparkContext.parallelize(range(2), 2).mapPartitions(frozen).collect()))
for _ in range(3):
    assert spark.sparkContext.parallelize(range(100), 2).map(lambda x: x * 2).sum() == 9900
spark.stop()
"""


@pytest.fixture(scope="module")
def one_session_stopped() -> subprocess.CompletedProcess[str]:
    """A fresh Python's own session (one JVM for the tests that need a session of their own, stopped):
    its Python workers' frozen objects counted, some Python work done, then stopped."""
    return run_python(ONE_SESSION_STOPPED)


@pytest.mark.timeout(330)  # a Spark session started (on a loaded machine, minutes)
def test_a_session_stops_without_a_traceback_from_its_idle_python_workers(
    one_session_stopped: subprocess.CompletedProcess[str],
) -> None:
    # PySpark's own daemon printed a BrokenPipeError traceback at about every other such stop
    assert "Traceback" not in one_session_stopped.stderr, one_session_stopped.stderr


def run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh Python (its own Spark session), which must succeed."""
    env = clean_env(("MESHPLANE_",)) | {"SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.timeout(330)  # a Spark session started (on a loaded machine, minutes)
def test_python_workers_inherit_the_daemons_objects_frozen_out_of_their_collections(
    one_session_stopped: subprocess.CompletedProcess[str],
) -> None:
    # PySpark's daemon collects after every task of a reused worker: frozen, what a worker inherits
    # (PySpark's imports, ~30,000 objects) is not walked each time. No meshplane read ran in that
    # session (its frozen count is taken first), so no scan froze anything of its own.
    assert int(one_session_stopped.stdout.strip().splitlines()[-1]) > 10_000


REGISTER_ON_A_PLAIN_SESSION = """
import json, os, sys
from pyspark.sql import SparkSession
from meshplane.spark import register

def workers_over_unix_sockets(spark):
    # PySpark's daemon learns the transport from this variable, set by the JVM's worker factory
    probe = lambda _: [os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED")]
    return spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect() == ["True"]

found = {}
for name, chosen in (("plain", None), ("chose_false", "false")):
    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    if chosen is not None:
        builder = builder.config("spark.python.unix.domain.socket.enabled", chosen)
    spark = builder.getOrCreate()
    register(spark)
    rows = spark.read.format("meshplane").option("url", sys.argv[1]).option("subscribe", "uds").load()
    found[name] = {"unix": workers_over_unix_sockets(spark), "rows": rows.count()}
    spark.stop()
print(json.dumps(found))
"""


@pytest.mark.timeout(330)  # a Spark session started twice (on a loaded machine, minutes)
def test_register_makes_python_workers_use_unix_sockets_unless_the_session_chose(
    server: StreamsServerProcess,
) -> None:
    run(publish(server.url, "uds", 0, 30, partitions=2))
    result = run_python(REGISTER_ON_A_PLAIN_SESSION, server.url)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # a session built without the setting gets it from register(); one that chose keeps its choice
    assert found == {"plain": {"unix": True, "rows": 30}, "chose_false": {"unix": False, "rows": 30}}


@pytest.mark.timeout(600)  # Spark starts twice (on a loaded machine, minutes each): its waits, 580 s
def test_up_runs_the_pipeline_and_its_windows_arrive_live(tmp_path: Path) -> None:
    env = clean_env(("DYN_", "NATS_", "MESHPLANE_"))
    up = subprocess.Popen(
        [
            *(*MESHPLANE, "up", "--state-dir", str(tmp_path)),
            *("--nats-port", "0", "--streams-port", "0", "--interval", "1", "--duration", "480"),
            *("--context", "none"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []

    def read_to(pattern: str, timeout: float) -> None:
        lines.extend(read_until(up.stdout, pattern, timeout, f"up printing {pattern!r}"))

    def status() -> subprocess.CompletedProcess[str]:
        return run_cli(
            "status", "--json", env={**env, "MESHPLANE_STATE_DIR": str(tmp_path), "MESHPLANE_CONTEXT": "none"}
        )

    try:
        read_to(r"Spark running, windows [1-9]", 200)
        assert any("Spark pipeline: starting" in line for line in lines)
        checks = {c["name"]: c for c in map(json.loads, status().stdout.splitlines())}
        assert checks["pipeline"]["state"] == "ok"
        pid = json.loads((tmp_path / "up.json").read_text())["pipeline"]["pid"]
        assert f"pid {pid}" in checks["pipeline"]["detail"]
        # Issue 35: a dead pipeline went unreported. Killed, it is restarted and says so everywhere.
        os.kill(pid, signal.SIGKILL)
        read_to(r"Spark restarting \(1/3: killed by SIGKILL", 60)
        down = status()
        assert down.returncode == 3
        assert "killed by SIGKILL" in down.stdout
        read_to(r"Spark running, restarted 1x, windows", 200)
        checks = {c["name"]: c for c in map(json.loads, status().stdout.splitlines())}
        assert checks["pipeline"]["state"] == "ok"
        assert "restarted 1x (last: killed by SIGKILL" in checks["pipeline"]["detail"]
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    assert up.returncode == 0


def _group(pgid: int) -> dict[int, str]:
    """The processes of a process group: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(") ", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.timeout(590)  # its waits add up to 570 s
def test_kill_9_of_up_leaves_no_pipeline_process_and_a_held_checkpoint_is_named(tmp_path: Path) -> None:
    """Issue 53, item 4: `up` SIGKILLed once its pipeline's JVM runs: nothing of the pipeline stays
    (the guard's parent-death signal takes its process group, JVM included). A pipeline still holding
    the checkpoint when `up` starts is named in one line, and no second one is started."""
    env = clean_env(("DYN_", "NATS_", "MESHPLANE_"))
    argv = [
        *(*MESHPLANE, "up", "--state-dir", str(tmp_path)),
        *("--nats-port", "0", "--streams-port", "0", "--duration", "300", "--context", "none"),
    ]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        read_until(up.stdout, r"Spark pipeline: starting", 120, "up starting its pipeline")
        wait_until((tmp_path / "pipeline.pid").exists, timeout=30, what="the pipeline's pid file")
        guard = int((tmp_path / "pipeline.pid").read_text())
        wait_until(
            lambda: any(_is_spark_jvm(line) for line in _group(guard).values()),
            timeout=240,
            interval=0.5,
            what="the pipeline's JVM running",
        )
        group = _group(guard)
        up.kill()
        up.wait()
        wait_until(lambda: not _group(guard), timeout=60, interval=0.2, what=f"nothing left of {group}")
    finally:
        if up.poll() is None:
            up.kill()
        _kill_left_of(tmp_path)  # what else up started (its servers) has no parent-death signal

    # A stand-in for a pipeline left by an older `up`: a guard process named in the pid file.
    holder = subprocess.Popen(
        [sys.executable, "-m", "meshplane.cli.pipeline_guard", str(os.getpid()), "--", "sleep", "600"],
        start_new_session=True,
    )
    try:
        (tmp_path / "pipeline.pid").write_text(f"{holder.pid}\n")
        up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines = read_until(up.stdout, r"Spark pipeline: ", 120, "up saying what of its pipeline")
        assert f"a pipeline from an earlier run, pid {holder.pid}, still holds its checkpoint" in lines[-1]
        assert f"kill -- -{holder.pid}" in lines[-1]
    finally:
        up.terminate()
        up.wait(60)
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def _is_spark_jvm(command: str) -> bool:
    """Spark's driver JVM (not the launcher that spark-class runs first to build its command)."""
    return Path(command.split(" ", 1)[0]).name == "java" and "deploy.SparkSubmit" in command


def _kill_left_of(state_dir: Path) -> None:
    """The processes a killed `up` started for this test (their command lines name its state dir)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(state_dir) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
