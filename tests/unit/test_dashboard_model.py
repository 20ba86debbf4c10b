"""The dashboard's pure parts: trends, readable payloads, the time search and the scope tree."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.names import Scope
from meshplane.core.records import EventChannel
from meshplane.dashboard.model import PREVIEW_BYTES, Trends, first_at_or_after, hexdump, readable, scope_tree


def test_rates_are_per_second_since_the_previous_sample_and_zero_when_a_counter_goes_back() -> None:
    trends = Trends()
    assert trends.rates(100.0, {"in": 10}) == {"in": 0.0}  # nothing to compare with yet
    assert trends.rates(102.0, {"in": 30, "topic:a": 5}) == {"in": 10.0, "topic:a": 0.0}
    assert trends.rates(103.0, {"in": 31, "topic:a": 2}) == {"in": 1.0, "topic:a": 0.0}  # a was made again


def test_series_keep_the_span_end_with_what_they_measure_and_are_bounded_in_number() -> None:
    trends = Trends(span=3, max_series=2)
    for t in range(5):
        trends.record(float(t), {"in": t, "topic:a": 1.0, "topic:b": 2.0})
    assert trends.export() == {
        "in": [(2.0, 2), (3.0, 3), (4.0, 4)],
        "topic:a": [(2.0, 1.0), (3.0, 1.0), (4.0, 1.0)],
    }
    trends.record(5.0, {"in": 5})  # topic a deleted: its series ends, making room for b
    trends.record(6.0, {"in": 6, "topic:b": 2.0})
    assert set(trends.series) == {"in", "topic:b"}
    assert trends.export(["topic:b", "missing"]) == {"topic:b": [(6.0, 2.0)]}


def test_json_data_is_shown_as_it_is() -> None:
    assert readable({"a": [1, "x"]}) == {"format": "json", "value": {"a": [1, "x"]}}
    assert readable("text") == {"format": "json", "value": "text"}


def test_messagepack_is_decoded_and_nested_bytes_become_base64() -> None:
    raw = msgspec.msgpack.encode({"worker": 3, "blob": b"\x00\x01", 7: "int key"})
    assert readable(raw) == {
        "format": "msgpack",
        "value": {"worker": 3, "blob": {"base64": "AAE="}, "7": "int key"},
        "size": len(raw),
    }


def test_utf8_bytes_are_text_and_other_bytes_a_hex_dump_cut_at_the_preview() -> None:
    assert readable(b"hello") == {"format": "text", "value": "hello", "size": 5}
    big = bytes([0xFF]) * (PREVIEW_BYTES + 10)
    shown = readable(big)
    assert shown["format"] == "binary"
    assert shown["truncated"] is True
    assert shown["size"] == len(big)
    assert shown["value"].count("\n") == PREVIEW_BYTES // 16 - 1
    assert readable(b"") == {"format": "text", "value": "", "size": 0}


def test_hexdump_lines_look_like_hexdump_c() -> None:
    assert hexdump(b"AB\x00" * 6) == (
        "00000000  41 42 00 41 42 00 41 42 00 41 42 00 41 42 00 41  |AB.AB.AB.AB.AB.A|\n"
        "00000010  42 00                                            |B.|"
    )


@given(st.lists(st.integers(0, 50), max_size=40).map(sorted), st.integers(-5, 60), st.integers(0, 100))
def test_the_time_search_finds_what_a_scan_finds(stamps: list[int], wanted: int, start: int) -> None:
    start = min(start, len(stamps))
    expected = next((o for o in range(start, len(stamps)) if stamps[o] >= wanted), len(stamps))
    reads: list[int] = []

    def stamp_of(offset: int) -> int:
        reads.append(offset)
        return stamps[offset]

    assert first_at_or_after(start, len(stamps), stamp_of, wanted) == expected
    assert len(reads) <= max(1, (len(stamps) - start).bit_length())


def test_the_scope_tree_nests_namespace_component_endpoint_topic_publishers() -> None:
    channels = [
        EventChannel(
            Scope.endpoint("dynamo", "worker", "generate"), "kv", 0xB, "zmq", {"endpoint": "tcp://h:1"}
        ),
        EventChannel(
            Scope.endpoint("dynamo", "worker", "generate"), "kv", 0xA, "nats", {"subject_prefix": "s"}
        ),
        EventChannel(Scope.namespace("dynamo"), "status", 0xC, "nats"),
    ]
    tree = scope_tree(channels)
    assert [n["name"] for n in tree] == ["dynamo"]
    dynamo = tree[0]
    assert [(n["kind"], n["name"]) for n in dynamo["children"]] == [
        ("component", "worker"),
        ("topic", "status"),
    ]
    endpoint = dynamo["children"][0]["children"][0]
    assert (endpoint["kind"], endpoint["name"]) == ("endpoint", "generate")
    topic = endpoint["children"][0]
    assert topic["publishers"] == [
        {"instance_id": "a", "transport": "nats", "address": "s"},
        {"instance_id": "b", "transport": "zmq", "address": "tcp://h:1"},
    ]
