"""Offsets of the Spark source: resolution, admission control, ranges (pure, no Spark)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetsError,
    admit,
    cap,
    check_order,
    check_written,
    fill_new_partitions,
    markers,
    normalize,
    ranges,
    resolve,
)

BOUNDS = {"orders": {"0": (10, 100), "1": (0, 50), "2": (5, 5)}}


def test_earliest_and_latest():
    assert resolve("earliest", BOUNDS, "latest") == {"orders": {"0": 10, "1": 0, "2": 5}}
    assert resolve("latest", BOUNDS, "earliest") == {"orders": {"0": 100, "1": 50, "2": 5}}
    assert resolve(None, BOUNDS, "earliest") == {"orders": {"0": 10, "1": 0, "2": 5}}


def test_json_offsets_with_kafka_markers():
    option = json.dumps({"orders": {"0": 42, "1": -2, "2": -1}})
    assert resolve(option, BOUNDS, "latest") == {"orders": {"0": 42, "1": 0, "2": 5}}


def test_json_offsets_must_name_every_partition_read_as_kafkas_do():
    with pytest.raises(
        OffsetsError, match=r"startingOffsets must give every partition read .*orders/1, orders/2"
    ):
        resolve('{"orders": {"0": 42}}', BOUNDS, "earliest", "startingOffsets")
    with pytest.raises(OffsetsError, match=r"leaves out orders/0, orders/1, orders/2"):
        resolve("{}", BOUNDS, "earliest", "endingOffsets")


def test_markers_name_the_partitions_set_to_one():
    assert markers('{"a": {"0": -1, "1": 5}, "b": {"3": -1}}', LATEST) == ["a/0", "b/3"]
    assert markers('{"a": {"0": -1}}', EARLIEST) == []
    assert markers("latest", LATEST) == []
    assert markers(None, LATEST) == []


def test_an_end_before_its_start_is_refused():
    check_order({"t": {"0": 3}}, {"t": {"0": 3}})
    with pytest.raises(OffsetsError, match=r"t/1 ends at 2, before its start 4"):
        check_order({"t": {"0": 3, "1": 4}}, {"t": {"0": 9, "1": 2}})


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("soonest", "earliest, latest or JSON"),
        ("[1]", "object of topics"),
        ('{"users": {"0": 1}}', "not read: users"),
        ('{"orders": {"7": 1}}', "no partition '7'"),
        ('{"orders": {"0": -3, "1": 0, "2": 0}}', "orders/0 must be an integer >= -2"),
        ('{"orders": {"0": 1, "1": "5", "2": 0}}', "orders/1 must be an integer >= -2"),
    ],
)
def test_bad_offsets_are_clear_errors(option, message):
    with pytest.raises(OffsetsError, match=message):
        resolve(option, BOUNDS, "latest")


def test_ending_offsets_past_the_written_events_are_refused():
    check_written(
        resolve('{"orders": {"0": 100, "1": -1, "2": -1}}', BOUNDS, "latest"), BOUNDS, "endingOffsets"
    )
    with pytest.raises(OffsetsError, match=r"endingOffsets lie past .*orders/0 at 101 \(it ends at 100\)"):
        check_written(
            resolve('{"orders": {"0": 101, "1": 0, "2": 5}}', BOUNDS, "latest"), BOUNDS, "endingOffsets"
        )


def test_offsets_serialise_identically_whatever_the_insertion_order():
    a = normalize({"b": {"1": 2, "0": 1}, "a": {"10": 3, "2": 4}})
    b = normalize({"a": {"2": 4, "10": 3}, "b": {"0": 1, "1": 2}})
    assert json.dumps(a) == json.dumps(b)


def test_new_partitions_start_at_their_earliest_offset():
    start = {"orders": {"0": 50}}
    assert fill_new_partitions(start, BOUNDS) == {"orders": {"0": 50, "1": 0, "2": 5}}


def test_available_now_caps_the_end():
    latest = {"orders": {"0": 100, "1": 80}}
    assert cap(latest, {"orders": {"0": 90}}) == {"orders": {"0": 90, "1": 80}}
    assert cap(latest, None) == normalize(latest)


def test_admission_shares_the_budget_by_backlog():
    start = {"t": {"0": 0, "1": 0, "2": 0, "3": 0}}
    latest = {"t": {"0": 250, "1": 250, "2": 250, "3": 250}}
    assert admit(start, latest, 300) == {"t": {"0": 75, "1": 75, "2": 75, "3": 75}}
    assert admit(start, latest, 301) == {"t": {"0": 76, "1": 75, "2": 75, "3": 75}}
    assert admit(start, latest, None) == normalize(latest)
    assert admit(start, {"t": {"0": 10, "1": 0, "2": 0, "3": 0}}, 300) == {
        "t": {"0": 10, "1": 0, "2": 0, "3": 0}
    }


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=6),
    st.integers(1, 3000),
)
def test_admission_never_exceeds_the_budget_nor_the_backlog(parts, budget):
    start = {"t": {str(i): s for i, (s, _) in enumerate(parts)}}
    latest = {"t": {str(i): s + n for i, (s, n) in enumerate(parts)}}
    end = admit(start, latest, budget)
    taken = [end["t"][p] - start["t"][p] for p in start["t"]]
    assert all(0 <= t <= latest["t"][p] - start["t"][p] for t, p in zip(taken, start["t"], strict=True))
    assert sum(taken) == min(budget, sum(n for _, n in parts))  # the whole budget is used when it can be


def test_ranges_skip_empty_partitions():
    assert ranges({"t": {"0": 5, "1": 7}}, {"t": {"0": 9, "1": 7, "10": 3}}) == [("t", 0, 5, 9)]


def test_split_halves_the_largest_range_until_there_are_enough() -> None:
    from meshplane.spark.offsets import split

    assert split([("t", 0, 0, 100), ("t", 1, 0, 10)], 1) == [("t", 0, 0, 100), ("t", 1, 0, 10)]
    assert split([("t", 0, 0, 100), ("t", 1, 0, 10)], 4) == [
        ("t", 0, 0, 25),
        ("t", 0, 25, 50),
        ("t", 0, 50, 100),
        ("t", 1, 0, 10),
    ]
    assert split([("t", 0, 5, 7)], 10) == [("t", 0, 5, 6), ("t", 0, 6, 7)]  # never below one event


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000), st.integers(1, 1000)), max_size=6),
    st.integers(0, 40),
)
def test_split_covers_every_offset_once(spans: list[tuple[int, int, int]], wanted: int) -> None:
    from meshplane.spark.offsets import split

    ranges = [("t", p, first, first + size) for p, (_, first, size) in enumerate(spans)]
    out = split(ranges, wanted)
    covered = sorted((t, p, o) for t, p, a, b in out for o in range(a, b))
    assert covered == sorted((t, p, o) for t, p, a, b in ranges for o in range(a, b))
    events = sum(b - a for _, _, a, b in ranges)
    assert len(out) >= min(wanted, events) or len(out) == len(ranges) >= wanted


def test_skip_deleted_moves_a_start_to_the_oldest_kept_offset_in_one_step() -> None:
    from meshplane.spark.offsets import backlog, skip_deleted

    bounds = {"t": {"0": (2800, 3000), "1": (0, 10)}}
    assert skip_deleted({"t": {"0": 300, "1": 4}}, bounds) == {"t": {"0": 2800, "1": 4}}
    assert backlog({"t": {"0": 2800, "1": 4}}, {"t": {"0": 3000, "1": 10}}) == 206
