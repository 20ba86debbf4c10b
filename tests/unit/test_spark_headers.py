"""Kafka headers through an event's metadata: exact round trips, plain entries where they fit. Pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplane.spark.headers import BASE64, HEADERS_KEY, from_metadata, to_metadata

keys = st.text(max_size=8)
values = st.none() | st.binary(max_size=16)


@given(st.lists(st.tuples(keys, values), max_size=8), st.booleans())
def test_any_headers_round_trip_exactly(headers: list[tuple[str, bytes | None]], plain: bool) -> None:
    assert from_metadata(to_metadata(headers, plain=plain)) == headers


def test_headers_that_fit_a_map_are_plain_entries_other_clients_read() -> None:
    assert to_metadata([("trace", b"abc"), ("user", "u1")]) == {"trace": "abc", "user": "u1"}


def test_nulls_repeats_and_bytes_are_stored_whole() -> None:
    for headers in ([("hn", None)], [("dup", b"1"), ("dup", b"2")], [("bin", b"\xff\x00")]):
        stored = to_metadata(headers)
        assert list(stored) == [HEADERS_KEY]
        assert from_metadata(stored) == headers


def test_a_binary_key_that_is_not_utf8_is_replaced_as_kafkas_string_keys_are() -> None:
    assert from_metadata(to_metadata([(b"k\xff", b"v")])) == [("k\ufffd", b"v")]


def test_meshplanes_own_entries_are_not_headers() -> None:
    assert from_metadata({"a": "1", BASE64: "base64", "b": "2"}) == [("a", b"1"), ("b", b"2")]
    assert from_metadata(to_metadata([("meshplane.x", b"1")])) == [("meshplane.x", b"1")]


def test_an_entry_another_client_wrote_under_the_headers_key_is_read_as_metadata() -> None:
    assert from_metadata({HEADERS_KEY: "not json", "a": "1"}) == [("a", b"1")]
    assert from_metadata({HEADERS_KEY: '[["k", 5]]'}) == []
