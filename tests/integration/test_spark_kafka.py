"""format("meshplane") as a user of Spark's Kafka source and sink knows it: each finding of the
Kafka-parity report, on a real local[2] session against a real `meshplane serve`."""

from __future__ import annotations

import json
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.spark.lag import offsets_behind
from meshplane.streams.client import StreamsClient
from tests.helpers import wait_until
from tests.spark_support import collect_available_now, publish, reader, run


async def topics(url: str) -> list[str]:
    async with StreamsClient(url) as client:
        return list(await client.topics())


def create_topic(url: str, topic: str, partitions: int, **settings: Any) -> None:
    async def go() -> None:
        async with StreamsClient(url) as client:
            await client.create_topic(topic, partitions, **settings)

    run(go())


def batch_read(spark: SparkSession, url: str, **options: str) -> DataFrame:
    frame = spark.read.format("meshplane").option("url", url)
    for name, value in options.items():
        frame = frame.option(name, value)
    return frame.load()


def test_an_empty_batch_read_is_empty(spark: SparkSession, server: StreamsServerProcess) -> None:
    create_topic(server.url, "nothing-yet", 2)
    assert batch_read(spark, server.url, subscribe="nothing-yet").count() == 0
    run(publish(server.url, "nothing-yet", 0, 10, partitions=2))
    assert batch_read(spark, server.url, subscribe="nothing-yet").count() == 10


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffset": "earliest"}, "unknown option 'startingoffset'.* did you mean startingOffsets"),
        ({"url": "http://127.0.0.1:9/api"}, r"url must look like http://host:port \(no path\)"),
        ({"maxEventsPerTrigger": "-1"}, "maxOffsetsPerTrigger must be an integer >= 1"),
        ({"startingOffsets": "{not json"}, "startingOffsets must be earliest | latest or JSON"),
    ],
)
def test_a_bad_option_fails_at_load_in_one_line(
    spark: SparkSession, server: StreamsServerProcess, options: dict[str, str], message: str
) -> None:
    stream = spark.readStream.format("meshplane").option("url", server.url).option("subscribe", "t")
    for name, value in options.items():
        stream = stream.option(name, value)
    with pytest.raises(Exception, match=message) as caught:
        stream.load()  # not start(): nothing runs with a wrong option
    meshplane_lines = [line for line in str(caught.value).splitlines() if "SparkOptionError:" in line]
    assert len(meshplane_lines) == 1  # one line says what is wrong
    assert "UnboundLocalError" not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "latest"}, "startingOffsets cannot be latest in a batch read"),
        ({"startingOffsets": '{"spec": {"0": 0, "1": -1}}'}, r"cannot be latest \(-1\) .*: spec/1"),
        ({"endingOffsets": '{"spec": {"0": -2, "1": 3}}'}, r"cannot be earliest \(-2\) .*: spec/0"),
        ({"startingOffsets": '{"spec": {"0": 2}}'}, "must give every partition read .* leaves out spec/1"),
        (
            {"startingOffsets": '{"spec": {"0": 4, "1": 0}}', "endingOffsets": '{"spec": {"0": 2, "1": 1}}'},
            "spec/0 ends at 2, before its start 4",
        ),
        (
            {"startingTimestamp": "99999999999999"},
            r"no event is stamped at or after spec/0 at 99999999999999",
        ),
        (  # a partition that does not exist: refused as startingOffsets refuses it
            {"startingOffsetsByTimestamp": '{"spec": {"0": 0, "1": 0, "7": 0}}'},
            r"startingOffsetsByTimestamp: topic 'spec' has no partition '7'",
        ),
        (  # a start past the end blames the start, not an endingOffsets never set
            {"startingOffsets": '{"spec": {"0": 500, "1": 0}}'},
            r"startingOffsets lie past the written events: spec/0 at 500",
        ),
    ],
)
def test_a_batch_read_refuses_offset_specs_kafka_refuses(
    spark: SparkSession, server: StreamsServerProcess, options: dict[str, str], message: str
) -> None:
    if "spec" not in run(topics(server.url)):
        run(publish(server.url, "spec", 0, 20, partitions=2))
    with pytest.raises(Exception, match=message) as caught:
        batch_read(spark, server.url, subscribe="spec", **options).collect()
    assert "Traceback" not in str(caught.value)  # one line: register() hides the Python frames


@pytest.mark.timeout(200)  # two waits of 60 s and a query's start
def test_subscribe_waits_for_a_topic_that_does_not_exist_yet(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    query = (
        reader(spark, server.url, "appears-later", startingOffsets="earliest")
        .writeStream.format("memory")
        .queryName("appears_later")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_until(lambda: query.lastProgress is not None, 60, 0.05, "a first (empty) micro-batch")
        assert query.exception() is None
        run(publish(server.url, "appears-later", 0, 30, partitions=3))
        wait_until(
            lambda: spark.sql("SELECT count(*) AS n FROM appears_later").collect()[0]["n"] == 30,
            timeout=60,
            interval=0.2,  # each look runs a Spark job: not 100 a second beside the query
            what="the topic's 30 events, once it was created",
        )
    finally:
        query.stop()


def test_a_stream_refuses_ending_offsets(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "endless", 0, 5, partitions=1))
    frame = reader(spark, server.url, "endless", endingOffsets="latest")
    with pytest.raises(Exception, match="endingOffsets is for batch reads; a streaming query has no end"):
        collect_available_now(frame, tmp_path / "checkpoint")


def test_headers_round_trip_exactly_and_the_default_save_mode_appends(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    written = [
        [("hn", None)],
        [("dup", b"1"), ("dup", b"2")],
        [("bin", b"\xff\x00"), ("meshplane.encoding", b"mine")],
        [("plain", b"text"), ("z", b"")],
        [],
    ]
    rows = spark.createDataFrame(
        [(str(i).encode(), b"\xfe" if i == 2 else b"v", h) for i, h in enumerate(written)],
        "key binary, value binary, headers array<struct<key string, value binary>>",
    )
    rows.write.format("meshplane").option("url", server.url).option(
        "topic", "headed"
    ).save()  # Spark's default mode
    back = sorted(
        batch_read(spark, server.url, subscribe="headed", includeHeaders="true").collect(),
        key=lambda r: r["key"],
    )
    assert [[(h["key"], h["value"]) for h in r["headers"] or []] for r in back] == written
    assert back[4]["headers"] is None  # no headers: null, as Kafka gives
    assert back[2]["value"] == b"\xfe"  # its internal encoding marker is not among the headers
    assert back[3]["metadata"] == {"plain": "text", "z": ""}  # headers that fit a map stay readable metadata
    with pytest.raises(Exception, match="the meshplane sink only appends: use mode append"):
        rows.write.mode("overwrite").format("meshplane").option("url", server.url).option(
            "topic", "headed"
        ).save()
    with pytest.raises(Exception, match="Ignore"):
        rows.write.mode("ignore").format("meshplane").option("url", server.url).option(
            "topic", "headed"
        ).save()
    assert batch_read(spark, server.url, subscribe="headed").count() == len(written)  # neither wrote


@pytest.fixture(params=["local", "jetstream"])
def any_storage_server(
    request: pytest.FixtureRequest, server: StreamsServerProcess
) -> Iterator[StreamsServerProcess]:
    """The module's server (local log), or one on its own JetStream."""
    if request.param == "local":
        yield server
        return
    with NatsServer(jetstream=True) as nats:
        extra = ("--storage", nats.start().url)
        with StreamsServerProcess(extra_args=extra) as on_jetstream:
            yield on_jetstream.start()


def test_any_bytes_are_a_key_written_and_read_back_exactly(
    spark: SparkSession, any_storage_server: StreamsServerProcess
) -> None:
    url = any_storage_server.url
    create_topic(url, "bytes-keyed", 3)
    odd = [b"\xff\x00\xfe", b"\x80", b"\xc3", b"", "caf\u00e9".encode(), b"\x00" * 300, None]
    # Enough rows for several chunks: the compiled scan copies any bytes into Kafka's binary key column;
    # columns=legacy's string key takes the general decoder for keys that are not UTF-8.
    keys = odd + [bytes([i % 256, (i * 7) % 256]) if i % 3 else f"k{i}".encode() for i in range(3000)]
    rows = spark.createDataFrame(
        [(k, str(i).encode()) for i, k in enumerate(keys)], "key binary, value binary"
    )
    rows.write.format("meshplane").option("url", url).option("topic", "bytes-keyed").save()
    back = batch_read(spark, url, subscribe="bytes-keyed").collect()
    assert {int(r["value"]): r["key"] for r in back} == dict(enumerate(keys))
    # routed by crc32 of the key's bytes, as Kafka's clients and Synap's do
    assert all(r["partition"] == zlib.crc32(r["key"]) % 3 for r in back if r["key"] is not None)
    # columns=legacy keeps a string key: bytes that are not UTF-8 read with U+FFFD, as header keys do
    legacy = {
        int(r["value"]): r["key"]
        for r in batch_read(spark, url, subscribe="bytes-keyed", columns="legacy")
        .where("CAST(value AS STRING) IN ('1', '4')")
        .collect()
    }
    assert legacy == {1: "\ufffd", 4: "caf\u00e9"}


def test_the_columns_are_kafkas_first_and_legacy_keeps_the_old_ones(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    run(publish(server.url, "shaped", 0, 3, partitions=1))
    kafka = batch_read(spark, server.url, subscribe="shaped", includeHeaders="true")
    assert [(f.name, f.dataType.simpleString()) for f in kafka.schema.fields] == [
        ("key", "binary"),
        ("value", "binary"),
        ("topic", "string"),
        ("partition", "int"),
        ("offset", "bigint"),
        ("timestamp", "timestamp"),
        ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>"),
        ("event_type", "string"),
        ("id", "string"),
        ("metadata", "map<string,string>"),
    ]
    assert kafka.collect()[0]["key"] == b"customer-0"
    legacy = batch_read(spark, server.url, subscribe="shaped", columns="legacy")
    assert legacy.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "event_type",
        "id",
        "metadata",
        "timestampType",
    ]
    assert legacy.collect()[0]["key"] == "customer-0"


def test_sink_keeps_nulls_refuses_unnamed_values_and_lets_the_topic_option_win(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    create_topic(server.url, "sink-a", 1)
    create_topic(server.url, "sink-b", 1)
    rows = spark.createDataFrame(
        [("k1", None, "sink-b", [("trace", b"abc")]), ("k2", "text", "sink-b", [])],
        "key string, value string, topic string, headers array<struct<key string, value binary>>",
    )
    rows.write.mode("append").format("meshplane").option("url", server.url).option("topic", "sink-a").save()
    assert batch_read(spark, server.url, subscribe="sink-b").count() == 0  # the option won (Kafka)
    back = {
        r["key"].decode(): r
        for r in batch_read(spark, server.url, subscribe="sink-a", includeHeaders="true").collect()
    }
    assert back["k1"]["value"] is None  # null stays null, not b"null"
    assert back["k2"]["value"] == b"text"
    assert [(h["key"], h["value"]) for h in back["k1"]["headers"]] == [("trace", b"abc")]
    assert back["k1"]["metadata"] == {"trace": "abc"}
    assert back["k1"]["timestampType"] == 1  # LogAppendTime: the server stamps events

    numbers = spark.createDataFrame([(5,)], "value int")
    with pytest.raises(Exception, match="value column is int; cast it to string or binary"):
        numbers.write.mode("append").format("meshplane").option("url", server.url).option(
            "topic", "sink-a"
        ).save()
    structs = spark.createDataFrame([((1, "x"),)], "value struct<n int, s string>")
    structs.write.mode("append").format("meshplane").option("url", server.url).option(
        "topic", "sink-b"
    ).option("valueFormat", "json").save()
    (only,) = batch_read(spark, server.url, subscribe="sink-b").collect()
    assert json.loads(only["value"]) == {"n": 1, "s": "x"}  # names kept


def test_subscribe_pattern_and_assign_choose_what_is_read(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    for topic in ("metrics-cpu", "metrics-disk", "other"):
        run(publish(server.url, topic, 0, 20, partitions=2))
    by_pattern = batch_read(spark, server.url, subscribePattern="metrics-.*").collect()
    assert {r["topic"] for r in by_pattern} == {"metrics-cpu", "metrics-disk"}
    assert len(by_pattern) == 40
    assigned = batch_read(spark, server.url, assign=json.dumps({"other": [1]})).collect()
    assert {(r["topic"], r["partition"]) for r in assigned} == {("other", 1)}
    everything = batch_read(spark, server.url, subscribe="other").collect()
    assert len(assigned) == sum(1 for r in everything if r["partition"] == 1) > 0


def test_timestamps_choose_where_reading_starts_and_ends(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    run(publish(server.url, "timed", 0, 100, partitions=2))
    time.sleep(0.005)  # the server stamps in milliseconds: the next events are stamped later
    between = time.time_ns() // 1_000_000
    time.sleep(0.005)
    run(publish(server.url, "timed", 100, 100, partitions=2))

    def values(**options: str) -> list[int]:
        rows = batch_read(spark, server.url, subscribe="timed", **options).collect()
        return sorted(json.loads(r["value"])["i"] for r in rows)

    assert values(startingTimestamp=str(between)) == list(range(100, 200))
    assert values(endingTimestamp=str(between)) == list(range(100))
    partition_of = {
        json.loads(r["value"])["i"]: r["partition"]
        for r in batch_read(spark, server.url, subscribe="timed").collect()
    }
    per_partition = json.dumps({"timed": {"0": between, "1": 0}})
    expected = [i for i in range(200) if partition_of[i] == 1 or i >= 100]
    assert values(startingOffsetsByTimestamp=per_partition) == expected
    late = str(between + 3_600_000)  # no event that late: an error, as Kafka's default strategy
    with pytest.raises(Exception, match="no event is stamped at or after timed/0 at"):
        values(startingTimestamp=late)
    assert values(startingTimestamp=late, startingOffsetsByTimestampStrategy="latest") == []


def test_min_partitions_splits_a_large_range(spark: SparkSession, server: StreamsServerProcess) -> None:
    run(publish(server.url, "one-big", 0, 1000, partitions=1))
    frame = batch_read(spark, server.url, subscribe="one-big", minPartitions="4")
    assert frame.rdd.getNumPartitions() == 4
    assert sorted(r["offset"] for r in frame.collect()) == list(range(1000))


def test_a_skipped_range_is_reported_once_and_jumped_in_one_batch(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    create_topic(server.url, "mostly-gone", 1, retention_policy={"type": "Messages", "max_messages": 200})

    async def fill() -> None:
        async with StreamsClient(server.url) as client:
            for start in range(0, 3000, 100):
                await client.publish_batch(
                    "mostly-gone", [{"event_type": "e", "data": i} for i in range(start, start + 100)]
                )

    run(fill())
    frame = reader(
        spark,
        server.url,
        "mostly-gone",
        startingOffsets=json.dumps({"mostly-gone": {"0": 300}}),
        maxOffsetsPerTrigger="300",
        failOnDataLoss="false",
    )
    rows, sizes = collect_available_now(frame, tmp_path / "ckpt")
    assert sorted(r["offset"] for r in rows) == list(range(2800, 3000))
    assert 0 not in sizes  # no empty batches walking the deleted range
    assert sizes == [200]


def test_progress_gives_kafkas_lag_metrics(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "lagging", 0, 900, partitions=3))
    frame = reader(spark, server.url, "lagging", startingOffsets="earliest", maxOffsetsPerTrigger="300")
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    first = offsets_behind(query.recentProgress[0]["sources"][0])
    assert first["avgOffsetsBehindLatest"] * 3 == 900 - 300  # three partitions; 300 of 900 read
    assert (
        first["maxOffsetsBehindLatest"] >= first["avgOffsetsBehindLatest"] >= first["minOffsetsBehindLatest"]
    )
    last = query.lastProgress
    assert last is not None
    assert offsets_behind(last["sources"][0])["maxOffsetsBehindLatest"] == 0


@pytest.mark.timeout(300)  # two waits of 120 s and a restart
def test_a_streaming_query_survives_a_server_crash_and_restart(spark: SparkSession, tmp_path: Path) -> None:
    """SIGKILL the server mid-stream, start it again on the same port and data: the query keeps
    running, and every event arrives exactly once."""
    with StreamsServerProcess() as proc:
        proc.start()
        url = proc.url
        run(publish(url, "through-crash", 0, 500, partitions=2))
        seen: list[int] = []
        lock = threading.Lock()

        def each(batch: DataFrame, batch_id: int) -> None:
            got = [json.loads(r["value"])["i"] for r in batch.select("value").collect()]
            with lock:
                seen.extend(got)

        query = (
            # 50 a batch: the backlog still flows when the server dies
            reader(
                spark,
                url,
                "through-crash",
                startingOffsets="earliest",
                retryTimeoutMs="60000",
                maxOffsetsPerTrigger="50",
            )
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            wait_until(lambda: len(seen) >= 100, timeout=120, what="the first batches")
            with lock:
                assert len(seen) < 500, "the backlog was read before the kill"
            proc.kill()
            proc.start()  # same port, same data directory
            run(publish(url, "through-crash", 500, 500, partitions=2))
            wait_until(lambda: len(seen) >= 1000 or query.exception() is not None, 120, 0.05, "all")
            assert query.exception() is None
            assert query.isActive
            assert sorted(seen) == list(range(1000))  # nothing lost, nothing twice
        finally:
            query.stop()


def test_the_docs_parity_table_lists_what_works(spark: SparkSession, server: StreamsServerProcess) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    table = docs.split("<!-- kafka-parity -->")[1]
    supported = re.findall(r"^\| `([A-Za-z.]+)` \| source \| yes", table, re.MULTILINE)
    supported += re.findall(
        r"`([A-Za-z]+)`",
        "".join(re.findall(r"^\| (`[A-Za-z]+Timestamp.*?) \| source \| yes", table, re.MULTILINE)),
    )
    assert len(supported) >= 11
    run(publish(server.url, "parity", 0, 10, partitions=2))
    everything = batch_read(spark, server.url, subscribe="parity").collect()
    in_0 = sorted(r["offset"] for r in everything if r["partition"] == 0)
    in_1 = sorted(r["offset"] for r in everything if r["partition"] == 1)
    assert (len(everything), min(len(in_0), len(in_1)) > 1) == (10, True), "both partitions hold events"
    never = "99999999999999"

    def read(**options: str) -> DataFrame:
        chosen = {"assign", "subscribePattern"} & set(options)
        return batch_read(spark, server.url, **(options if chosen else {"subscribe": "parity", **options}))

    def places(**options: str) -> list[tuple[int, int]]:
        return sorted((r["partition"], r["offset"]) for r in read(**options).collect())

    def refused(**options: str) -> bool:
        try:
            read(**options).collect()
        except Exception as exc:  # Spark wraps it: the message is what counts
            return "no event is stamped at or after" in str(exc)
        return False

    every_place = [(0, o) for o in in_0] + [(1, o) for o in in_1]
    only_1 = [(1, o) for o in in_1]
    by_time = {
        "starting": f'{{"parity": {{"0": {never}, "1": 0}}}}',
        "ending": f'{{"parity": {{"0": 0, "1": {never}}}}}',
    }
    # Each option with what it must change (against reading everything), in a batch read:
    acts: dict[str, Callable[[], bool]] = {
        "subscribe": lambda: places() == every_place,
        "subscribePattern": lambda: places(subscribePattern="par.ty") == every_place,
        "assign": lambda: places(assign='{"parity": [1]}') == only_1,
        "startingOffsets": lambda: places(startingOffsets='{"parity": {"0": 1, "1": -2}}') == every_place[1:],
        "endingOffsets": lambda: (
            places(endingOffsets='{"parity": {"0": 1, "1": -1}}') == [(0, in_0[0]), *only_1]
        ),
        "minPartitions": lambda: read(minPartitions="5").rdd.getNumPartitions() >= 5,
        "includeHeaders": lambda: (
            "headers" in read(includeHeaders="true").columns and "headers" not in read().columns
        ),
        "startingTimestamp": lambda: refused(startingTimestamp=never),
        "startingOffsetsByTimestampStrategy": lambda: (
            places(startingTimestamp=never, startingOffsetsByTimestampStrategy="latest") == []
        ),
        "endingTimestamp": lambda: places(endingTimestamp="0") == [],
        "startingOffsetsByTimestamp": lambda: (
            places(
                startingOffsetsByTimestamp=by_time["starting"], startingOffsetsByTimestampStrategy="latest"
            )
            == only_1
        ),
        "endingOffsetsByTimestamp": lambda: places(endingOffsetsByTimestamp=by_time["ending"]) == only_1,
    }
    # Options that act only on streams or on lost data, each proven by the test named.
    proven_elsewhere = {
        "maxOffsetsPerTrigger": "test_max_offsets_per_trigger_caps_each_micro_batch",
        "minOffsetsPerTrigger": "test_min_offsets_per_trigger_waits_for_enough_events_or_the_delay",
        "maxTriggerDelay": "test_min_offsets_per_trigger_waits_for_enough_events_or_the_delay",
        "failOnDataLoss": "test_a_skipped_range_is_reported_once_and_jumped_in_one_batch",
    }
    assert set(supported) == set(acts) | set(proven_elsewhere)
    assert all(name in globals() for name in proven_elsewhere.values())
    failed = [name for name, check in acts.items() if not check()]
    assert failed == [], f"options that did not act: {failed}"


def test_max_offsets_per_trigger_caps_each_micro_batch(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "capped", 0, 23, partitions=2))
    rows, sizes = collect_available_now(
        reader(spark, server.url, "capped", startingOffsets="earliest", maxOffsetsPerTrigger="5"),
        tmp_path / "checkpoint",
    )
    assert sorted(json.loads(r["value"])["i"] for r in rows) == list(range(23))
    assert max(sizes) <= 5
    assert len(sizes) >= 5  # 23 events in batches of at most 5


def test_min_offsets_per_trigger_waits_for_enough_events_or_the_delay(server: StreamsServerProcess) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from meshplane.spark.options import Options
    from meshplane.spark.reader import MeshplaneStreamReader

    run(publish(server.url, "trickle", 0, 5, partitions=1))
    options = {"url": server.url, "subscribe": "trickle", "startingOffsets": "earliest"}
    stream = MeshplaneStreamReader(
        Options.for_source({**options, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "2s"})
    )
    try:
        first = stream.latestOffset(stream.initialOffset(), ReadAllAvailable())
        assert first == {"trickle": {"0": 5}}  # the first batch comes at once, as Kafka's does
        run(publish(server.url, "trickle", 5, 5, partitions=1))
        assert stream.latestOffset(first, ReadAllAvailable()) == first  # 5 < 10: no batch yet
        run(publish(server.url, "trickle", 10, 5, partitions=1))
        end = stream.latestOffset(first, ReadAllAvailable())
        assert end == {"trickle": {"0": 15}}  # enough: a batch at once
        run(publish(server.url, "trickle", 15, 1, partitions=1))
        assert stream.latestOffset(end, ReadAllAvailable()) == end  # one event, the delay just restarted
        later: list[dict[str, Any]] = []

        def batch_offered() -> bool:
            later.append(stream.latestOffset(end, ReadAllAvailable()))
            return later[-1] != end

        wait_until(batch_offered, timeout=10, what="a batch once maxTriggerDelay has passed")
        assert later[-1] == {"trickle": {"0": 16}}
    finally:
        stream.stop()


def test_a_querys_lag_shows_on_the_server_beside_the_groups(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    from meshplane.spark.http import SyncStreamsClient

    run(publish(server.url, "watched", 0, 100, partitions=2))
    frame = reader(spark, server.url, "watched", startingOffsets="earliest", readerName="etl-1")
    collect_available_now(frame, tmp_path / "checkpoint")
    client = SyncStreamsClient(server.url)
    try:
        (view,) = client.json("GET", "/topics/watched/readers")["readers"]
        assert (view["reader"], view["lag_total"]) == ("etl-1", 0)
        run(publish(server.url, "watched", 100, 25, partitions=2))
        (view,) = client.json("GET", "/topics/watched/readers")["readers"]
        assert view["lag_total"] == 25  # the server counts what the query has still to read
        _, _, metrics = client.request("GET", "/metrics")
        lines = [line for line in metrics.decode().splitlines() if line.startswith("meshplane_reader_lag{")]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in lines if 'reader="etl-1"' in line) == 25
        snapshot = client.json("GET", "/ui/api/snapshot")
        assert [(r["reader"], r["lag"]) for r in snapshot["readers"] if r["topic"] == "watched"] == [
            ("etl-1", 25)
        ]
        status, _, _ = client.request("PUT", "/topics/watched/readers/etl-1", {"offsets": {"7": 1}})
        assert status == 400  # no partition 7: refused, the view unchanged
    finally:
        client.close()


def test_every_query_has_its_own_lag_view_named_by_its_query_name_or_checkpoint(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    from meshplane.spark.http import SyncStreamsClient

    run(publish(server.url, "shared-source", 0, 60, partitions=2))
    frame = reader(spark, server.url, "shared-source", startingOffsets="earliest")  # the same options
    collect_available_now(frame, tmp_path / "one")
    collect_available_now(frame, tmp_path / "two")
    named = (
        frame.writeStream.queryName("daily_etl")
        .format("noop")
        .option("checkpointLocation", str(tmp_path / "n"))
    )
    named.trigger(availableNow=True).start().awaitTermination()
    run(publish(server.url, "shared-source", 60, 10, partitions=2))
    collect_available_now(frame, tmp_path / "one")  # the first query again, on its checkpoint
    client = SyncStreamsClient(server.url)
    try:
        views = client.json("GET", "/topics/shared-source/readers")["readers"]
        by_identity = sorted((v["identity"], v["lag_total"]) for v in views)
        assert by_identity == [("checkpoint", 0), ("checkpoint", 10), ("queryName", 10)]
        assert "spark-query-daily_etl" in {v["reader"] for v in views}
        snapshot = client.json("GET", "/ui/api/snapshot")
        shown = [r for r in snapshot["readers"] if r["topic"] == "shared-source"]
        assert sorted(r["identity"] for r in shown) == ["checkpoint", "checkpoint", "queryName"]
    finally:
        client.close()


def test_poison_metadata_stored_before_it_was_reserved_never_fails_a_chunk(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Events from before meshplane.* keys were the server's (the HTTP API refuses them now): written
    # into a data directory by the service itself, then served.
    from meshplane.core.streamlog import StoredEvent
    from meshplane.streams.service import StreamsConfig, StreamsService

    poison = [
        {"meshplane.encoding": "base64"},  # "abc" is not base64: Incorrect padding
        {"meshplane.headers": "[" * 100_000},  # RecursionError in json.loads
        {"tenant": "A", "meshplane.headers": '[["tenant", "not base64!"]]'},
    ]

    async def store() -> None:
        engine = StreamsService(StreamsConfig(data_dir=tmp_path / "data"))
        await engine.start()
        await engine.create_topic("poisoned", 1)
        events = [StoredEvent(f"g{i}", "e", f"good-{i}") for i in range(5)]
        events += [StoredEvent(f"p{i}", "e", "abc", None, m) for i, m in enumerate(poison)]
        events += [StoredEvent(f"g{i}", "e", f"good-{i}") for i in range(5, 10)]
        await engine.publish_topic("poisoned", events)
        await engine.close()

    run(store())
    with StreamsServerProcess(data_dir=tmp_path / "data") as server:
        server.start()
        for arrow in ("true", "false"):
            frame = (
                spark.read.format("meshplane")
                .option("url", server.url)
                .option("topic", "poisoned")
                .option("includeHeaders", "true")
                .option("arrow", arrow)
                .load()
            )
            rows = sorted(frame.collect(), key=lambda r: r["offset"])
            assert [bytes(r["value"]) for r in rows] == [
                *(f"good-{i}".encode() for i in range(5)),
                b"abc",
                b"abc",
                b"abc",
                *(f"good-{i}".encode() for i in range(5, 10)),
            ]
            assert [list(r["headers"] or []) for r in rows[5:8]] == [[], [], [("tenant", b"A")]]


def test_a_stream_starting_past_a_partitions_end_is_data_loss_as_kafka_reports_it(
    spark: SparkSession, server: StreamsServerProcess, tmp_path: Path
) -> None:
    run(publish(server.url, "short-stream", 0, 10, partitions=2))
    past = '{"short-stream": {"0": 500, "1": 0}}'
    with pytest.raises(
        Exception, match=r"short-stream/0: the query is at offset 500, past the partition's end"
    ):
        collect_available_now(reader(spark, server.url, "short-stream", startingOffsets=past), tmp_path / "a")
    frame = reader(spark, server.url, "short-stream", startingOffsets=past, failOnDataLoss="false")
    rows, _ = collect_available_now(frame, tmp_path / "b")
    assert rows  # the other partition is read; partition 0 goes on from its end
    assert {r["partition"] for r in rows} == {1}


def test_a_user_schema_is_checked_before_any_task_and_kafkas_seven_columns_read(
    spark: SparkSession, server: StreamsServerProcess
) -> None:
    run(publish(server.url, "schemed", 0, 6, partitions=2))
    kafka_seven = (
        "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
        "timestampType int"
    )
    frame = spark.read.format("meshplane").schema(kafka_seven).option("url", server.url)
    rows = frame.option("subscribe", "schemed").load().collect()
    assert len(rows) == 6
    assert rows[0].__fields__ == [column.split()[0] for column in kafka_seven.split(", ")]
    wrong = spark.read.format("meshplane").schema("key string, value binary").option("url", server.url)
    with pytest.raises(
        Exception, match="the schema given makes column key string; the meshplane source's is binary"
    ):
        wrong.option("subscribe", "schemed").load().collect()
