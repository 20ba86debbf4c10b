"""Readers' progress (a Spark query's committed offsets): bounded, lag counted from what they said."""

from __future__ import annotations

from types import SimpleNamespace

from meshplane.streams.readers import Readers, reader_lag


def test_a_reader_is_one_view_per_topic_and_name_updated_in_place() -> None:
    readers = Readers()
    readers.record("orders", "etl", {0: 5}, now=1.0)
    readers.record("orders", "etl", {0: 9, 1: 2}, now=2.0)
    readers.record("users", "etl", {0: 1}, now=3.0)
    (view,) = readers.of_topic("orders")
    assert (view.offsets, view.updated_at) == ({0: 9, 1: 2}, 2.0)
    readers.forget_topic("orders")
    assert readers.of_topic("orders") == []
    assert [v.topic for v in readers] == ["users"]


def test_the_least_recently_updated_is_forgotten_beyond_capacity() -> None:
    readers = Readers(capacity=2, per_topic=2)
    for i, name in enumerate(("a", "b", "c")):
        readers.record("t", name, {0: i}, now=float(i))
    readers.record("t", "b", {0: 7}, now=9.0)  # b moves to the back
    readers.record("t", "d", {0: 0}, now=10.0)
    assert sorted(v.name for v in readers) == ["b", "d"]
    assert readers.forgotten == 2


def test_junk_names_on_one_topic_evict_only_that_topics_views() -> None:
    readers = Readers(capacity=50, per_topic=10)
    readers.record("orders", "etl", {0: 1}, now=0.0)
    readers.record("users", "etl", {0: 1}, now=0.0)
    for i in range(1001):
        readers.record("junk", f"j{i}", {0: i}, now=1.0 + i)
    assert [v.name for v in readers.of_topic("orders")] == ["etl"]
    assert [v.name for v in readers.of_topic("users")] == ["etl"]
    assert len(readers.of_topic("junk")) == 10
    assert len(readers) == 12
    for t in range(45):  # many topics, one view each: the global bound takes from the largest first
        readers.record(f"t{t}", "q", {0: 0}, now=2000.0 + t)
    assert len(readers) == 50
    assert len(readers.of_topic("junk")) == 3
    assert all(len(readers.of_topic(f"t{t}")) == 1 for t in range(45))
    assert [v.name for v in readers.of_topic("orders")] == ["etl"]


def test_a_token_writes_its_own_views_never_another_tokens() -> None:
    readers = Readers()
    readers.record("orders", "etl", {0: 100}, now=0.0, owner="tA", identity="checkpoint")
    readers.record("orders", "etl", {0: 0}, now=1.0, owner="tB")  # same name, another token
    views = {v.owner: v for v in readers.of_topic("orders")}
    assert (views["tA"].offsets, views["tA"].identity) == ({0: 100}, "checkpoint")
    assert views["tB"].offsets == {0: 0}


def test_lag_counts_from_what_the_reader_said_and_a_partition_it_did_not_from_its_start() -> None:
    readers = Readers()
    readers.record("t", "q", {0: 10, 1: 50}, now=0.0)
    (view,) = readers.of_topic("t")
    logs = [SimpleNamespace(start_offset=start, next_offset=end) for start, end in [(0, 15), (0, 40), (3, 8)]]
    assert reader_lag(view, logs) == {0: 5, 1: 0, 2: 5}
