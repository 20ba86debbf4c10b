"""Options of format("meshplane"): Kafka's names, strict checks with one-line messages. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from meshplane.spark.options import SOURCE_OPTIONS, Options, SparkOptionError


def source(**given: Any) -> Options:
    return Options.for_source({"subscribe": "t", **given})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"startingOffset": "earliest"},
            r"unknown option 'startingOffset' for the meshplane source; did you mean startingOffsets\?",
        ),
        ({"startingTimestamp": "yesterday"}, r"startingTimestamp must be an integer >= 0"),
        (
            {"startingOffsetsByTimestamp": '{"t": {"0": "x"}}'},
            r"startingOffsetsByTimestamp must be JSON like",
        ),
        ({"url": "http://127.0.0.1:1/api"}, r"url must look like http://host:port \(no path\)"),
        ({"url": "ftp://127.0.0.1:1"}, r"url must look like"),
        ({"url": "http://127.0.0.1:1,http://127.0.0.1:2/x"}, r"not 'http://127.0.0.1:2/x'"),
        ({"maxEventsPerTrigger": "-1"}, r"maxOffsetsPerTrigger must be an integer >= 1, not '-1'"),
        ({"maxOffsetsPerTrigger": "many"}, r"maxOffsetsPerTrigger must be an integer >= 1"),
        ({"startingOffsets": "{garbage"}, r"startingOffsets must be earliest \| latest or JSON"),
        ({"endingOffsets": "first"}, r"endingOffsets must be earliest \| latest or JSON"),
        (
            {"startingOffsetsByTimestampStrategy": "closest"},
            r"Strategy must be error or latest, not 'closest'",
        ),
        ({"maxTriggerDelay": "10 minutes"}, r"maxTriggerDelay must be a duration like 15m, 10min"),
        ({"failOnDataLoss": "maybe"}, r"failOnDataLoss must be true or false"),
        ({"minPartitions": "0"}, r"minPartitions must be an integer >= 1"),
        ({"maxTriggerDelay": "soon"}, r"maxTriggerDelay must be a duration"),
        ({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, r"larger than maxOffsetsPerTrigger"),
        ({"subscribe": None, "subscribePattern": "("}, r"subscribePattern is not a regular expression"),
        ({"subscribePattern": "t.*"}, r"exactly one of subscribe .*; got subscribe, subscribePattern"),
        ({"subscribe": None, "assign": '{"t": ["0"]}'}, r'assign must be JSON like \{"topic": \[0, 1\]\}'),
        ({"vpn": "team a\r\nX-Evil: 1"}, r"option vpn: VPN name"),  # it goes in a header
    ],
)
def test_a_wrong_option_is_one_line_naming_it(given: dict[str, str | None], message: str) -> None:
    with pytest.raises(SparkOptionError, match=message) as caught:
        source(**given)
    assert "\n" not in str(caught.value)


def test_kafkas_own_options_are_accepted_with_a_warning_naming_each(caplog: pytest.LogCaptureFixture) -> None:
    given = {
        "kafka.bootstrap.servers": "h:9092",
        "kafka.group.id": "g",
        "kafka.auto.offset.reset": "earliest",
        "maxRecordsPerPartition": "10",
        "groupIdPrefix": "x",
        "kafkaConsumer.pollTimeoutMs": "512",
        "fetchOffset.numRetries": "3",
        "fetchOffset.retryIntervalMs": "10",
    }
    options = source(**{k.lower(): v for k, v in given.items()})  # Spark hands names in lower case
    assert sorted(options.ignored) == sorted(given)
    said = caplog.text
    assert "kafka.bootstrap.servers is Kafka's and does not apply to meshplane (it uses url)" in said
    assert (
        "kafka.auto.offset.reset is Kafka's and does not apply to meshplane (it uses startingOffsets)" in said
    )
    assert "kafkaConsumer.pollTimeoutMs is Kafka's and does not apply" in said
    assert Options.for_sink({"topic": "t", "kafka.acks": "all"}).ignored == ("kafka.acks",)


def test_offset_values_are_case_insensitive_as_kafkas() -> None:
    assert source(startingOffsets="EARLIEST").starting_offsets == "earliest"
    assert source(endingOffsets=" Latest ").ending_offsets == "latest"
    with pytest.raises(SparkOptionError, match="startingOffsets cannot be latest in a batch read"):
        source(startingOffsets="LATEST").check_batch()
    assert source(failOnDataLoss="FALSE").fail_on_data_loss is False


def test_the_url_may_list_several_servers_of_the_same_streams() -> None:
    assert source(url="http://a:1, http://b:2").url == "http://a:1, http://b:2"


def test_a_source_needs_exactly_one_way_to_name_its_topics() -> None:
    with pytest.raises(SparkOptionError, match="set exactly one of subscribe"):
        Options.for_source({})


def test_kafka_names_and_meshplane_aliases_mean_the_same() -> None:
    assert source(maxOffsetsPerTrigger="7") == source(maxEventsPerTrigger="7")
    assert (
        Options.for_source({"topic": "a, b"}).topics
        == ("a", "b")
        == Options.for_source({"subscribe": "a,b"}).topics
    )
    # Spark hands options case-insensitively
    assert source(MAXOFFSETSPERTRIGGER="7").max_events_per_trigger == 7


def test_values_are_parsed() -> None:
    options = source(
        minOffsetsPerTrigger="10",
        maxTriggerDelay="30s",
        minPartitions="8",
        includeHeaders="TRUE",
        failOnDataLoss="false",
        retryTimeoutMs="2500",
        checkpointLocation="/tmp/x",  # Spark's own: accepted
    )
    assert (options.min_events_per_trigger, options.max_trigger_delay, options.min_partitions) == (
        10,
        30.0,
        8,
    )
    assert (options.include_headers, options.fail_on_data_loss, options.retry_timeout) == (True, False, 2.5)
    assert Options.for_source({"assign": '{"t": [1, 0, 1]}'}).assign == {"t": (0, 1)}
    assert source(maxTriggerDelay="250ms").max_trigger_delay == 0.25
    by_time = source(startingOffsetsByTimestamp='{"t": {"1": 5}}', endingTimestamp="9")
    assert (by_time.starting_time, by_time.ending_time) == ({"t": {"1": 5}}, 9)
    assert source(startingTimestamp="7", startingOffsetsByTimestamp='{"t": {"1": 5}}').starting_time == 7


def test_the_sink_has_its_own_options() -> None:
    assert Options.for_sink({"topic": "out", "valueFormat": "JSON"}).value_format == "json"
    with pytest.raises(SparkOptionError, match="unknown option 'startingOffsets' for the meshplane sink"):
        Options.for_sink({"topic": "out", "startingOffsets": "earliest"})
    with pytest.raises(SparkOptionError, match="valueFormat must be strict or json"):
        Options.for_sink({"valueFormat": "pickle"})


def test_every_documented_option_is_accepted_in_any_case() -> None:
    assert len(SOURCE_OPTIONS) >= 20
    plain = Options.for_source({"subscribe": "t"})
    for name in SOURCE_OPTIONS:
        if name in ("subscribe", "topic", "topics"):
            assert Options.for_source({name.lower(): "t"}) == plain
        else:
            assert Options.for_source({name.lower(): None, "subscribe": "t"}) == plain


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10min", 600.0),
        ("15m", 900.0),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("250", 0.25),
        ("2H", 7200.0),
        ("1d", 86400),
    ],
)
def test_durations_are_written_as_spark_writes_them(text: str, seconds: float) -> None:
    assert source(maxTriggerDelay=text).max_trigger_delay == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"startingOffsets": "latest"}, r"startingOffsets cannot be latest in a batch read"),
        ({"startingOffsets": '{"t": {"0": 4, "1": -1}}'}, r"startingOffsets cannot be latest \(-1\).*: t/1$"),
        ({"endingOffsets": "earliest"}, r"endingOffsets cannot be earliest in a batch read"),
        ({"endingOffsets": '{"t": {"0": -2}}'}, r"endingOffsets cannot be earliest \(-2\).*: t/0$"),
    ],
)
def test_a_batch_read_refuses_what_kafka_refuses(given: dict[str, str], message: str) -> None:
    options = source(**given)
    if "startingOffsets" in given:
        options.check_streaming()  # a stream may start at the end
    with pytest.raises(SparkOptionError, match=message):
        options.check_batch()


@pytest.mark.parametrize(
    "given",
    [{"endingOffsets": "latest"}, {"endingTimestamp": "5"}, {"endingOffsetsByTimestamp": '{"t": {"0": 5}}'}],
)
def test_a_stream_refuses_ending_options(given: dict[str, str]) -> None:
    options = source(**given)
    options.check_batch()
    with pytest.raises(SparkOptionError, match=r"is for batch reads; a streaming query has no end"):
        options.check_streaming()


def test_the_timestamp_strategy_defaults_to_kafkas_error() -> None:
    assert source().starting_no_match == "error"
    assert source(startingOffsetsByTimestampStrategy="LATEST").starting_no_match == "latest"
