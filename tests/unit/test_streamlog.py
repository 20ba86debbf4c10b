"""The partition log's record format, retention decisions, offsets and key routing (pure)."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.streamlog import (
    HEADER_SIZE,
    RetentionPolicy,
    SegmentInfo,
    StoredEvent,
    decode_event,
    encode_event,
    encode_record,
    logical_start_offset,
    partition_for_key,
    resolve_start_offset,
    scan_records,
    segments_to_delete,
)
from meshplane.errors import OffsetOutOfRange

payloads = st.lists(st.binary(max_size=300), max_size=20)


def build(payload_list: list[bytes], first: int = 0) -> bytes:
    return b"".join(encode_record(first + i, 1000 + i, p) for i, p in enumerate(payload_list))


@given(payloads, st.integers(0, 2**40))
def test_records_round_trip(payload_list, first):
    result = scan_records(build(payload_list, first), expected_offset=first)
    assert result.problem is None
    assert [r.payload for r in result.records] == payload_list
    assert [r.offset for r in result.records] == list(range(first, first + len(payload_list)))
    assert result.valid_end == len(build(payload_list, first))


@given(payloads.filter(bool), st.data())
def test_a_torn_tail_yields_exactly_the_complete_records(payload_list, data):
    blob = build(payload_list)
    cut = data.draw(st.integers(0, len(blob)))
    result = scan_records(blob[:cut])
    ends = [r.position + r.size for r in result.records]
    # Every record that ends before the cut survives; nothing partial does.
    boundaries = []
    pos = 0
    for p in payload_list:
        pos += HEADER_SIZE + len(p)
        boundaries.append(pos)
    assert ends == [b for b in boundaries if b <= cut]
    assert result.valid_end == (ends[-1] if ends else 0)
    assert (result.problem is None) == (result.valid_end == cut)


@given(payloads.filter(bool), st.data())
def test_a_flipped_byte_is_never_returned_as_a_record(payload_list, data):
    blob = bytearray(build(payload_list))
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] ^= data.draw(st.integers(1, 255))
    result = scan_records(bytes(blob), expected_offset=0)
    for record in result.records:
        assert record.payload == payload_list[record.offset]
        assert record.position + record.size <= at or record.position > at
    assert result.valid_end <= at or result.problem is None


def test_an_offset_out_of_sequence_stops_the_scan():
    blob = encode_record(0, 1, b"a") + encode_record(5, 1, b"b")
    result = scan_records(blob, expected_offset=0)
    assert [r.offset for r in result.records] == [0]
    assert result.problem == "offset 5 where 1 was expected"


def test_stored_events_round_trip_with_bytes_and_json():
    event = StoredEvent("id1", "order.created", {"amount": 9.5, "items": [1, 2]}, "customer-1", {"v": "1"})
    assert decode_event(encode_event(event)) == event
    raw = StoredEvent("id2", "blob", b"\x00\xff")
    assert decode_event(encode_event(raw)).data == b"\x00\xff"


# --- retention -------------------------------------------------------------------------------------


def segs(*counts: int, size: int = 100, ts: list[int] | None = None) -> list[SegmentInfo]:
    out, base = [], 0
    for i, n in enumerate(counts):
        out.append(SegmentInfo(base, base + n, size, None if ts is None else ts[i]))
        base += n
    return out


def test_time_retention_deletes_expired_segments_but_never_the_active_one():
    segments = segs(10, 10, 10, ts=[1_000, 5_000, 9_000])
    policy = RetentionPolicy(retention_secs=3)
    assert segments_to_delete(segments, policy, now_ms=7_500) == 1  # 1000 is 6.5 s old, 5000 2.5 s
    assert segments_to_delete(segments, policy, now_ms=4_001) == 1
    assert segments_to_delete(segments, policy, now_ms=4_000) == 0
    assert segments_to_delete(segments, policy, now_ms=100_000) == 2  # the active one stays


def test_size_retention_keeps_at_least_max_bytes():
    segments = segs(5, 5, 5, 5, size=100)
    assert segments_to_delete(segments, RetentionPolicy(max_bytes=250), 0) == 1
    assert segments_to_delete(segments, RetentionPolicy(max_bytes=200), 0) == 2
    assert segments_to_delete(segments, RetentionPolicy(max_bytes=401), 0) == 0


def test_count_retention_is_exact_through_the_logical_start():
    segments = segs(10, 10, 10)
    policy = RetentionPolicy(max_messages=15)
    assert segments_to_delete(segments, policy, 0) == 1
    assert logical_start_offset(10, 30, policy) == 15


def test_combined_retention_smallest_limit_wins():
    segments = segs(10, 10, 10, 10, size=100, ts=[0, 0, 50_000, 60_000])
    policy = RetentionPolicy(retention_secs=3600, max_bytes=10_000, max_messages=25)
    assert segments_to_delete(segments, policy, 60_000) == 1  # the count limit is the smallest
    policy = RetentionPolicy(retention_secs=30, max_bytes=10_000, max_messages=1_000)
    assert segments_to_delete(segments, policy, 60_000) == 2  # the time limit is


def test_infinite_retention_deletes_nothing():
    assert segments_to_delete(segs(10, 10, ts=[0, 0]), RetentionPolicy(), 10**15) == 0
    assert RetentionPolicy().kind == "infinite"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"type": "Time", "retention_secs": 3600}, RetentionPolicy(retention_secs=3600)),
        ({"type": "Size", "max_bytes": 1000}, RetentionPolicy(max_bytes=1000)),
        ({"type": "Messages", "max_messages": 10}, RetentionPolicy(max_messages=10)),
        (
            {"type": "Combined", "retention_secs": 1, "max_bytes": 2, "max_messages": 3},
            RetentionPolicy(1, 2, 3),
        ),
        ({"type": "Infinite"}, RetentionPolicy()),
        (None, RetentionPolicy()),
    ],
)
def test_synap_retention_shapes_parse(raw, expected):
    assert RetentionPolicy.from_json(raw) == expected
    if raw:
        assert RetentionPolicy.from_json(expected.to_json()) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "Weekly"}, "unknown retention type"),
        ({"type": "Time"}, "needs retention_secs"),
        ({"type": "Size", "max_bytes": -1}, "positive"),
        ({"type": "Messages", "max_messages": "ten"}, "positive"),
        ([1], "must be an object"),
    ],
)
def test_bad_retention_is_a_clear_error(raw, message):
    with pytest.raises(ValueError, match=message):
        RetentionPolicy.from_json(raw)


# --- offsets and keys ------------------------------------------------------------------------------


def test_start_offsets_latest_beginning_specific_and_relative():
    assert resolve_start_offset(None, 10, 20) == 20
    assert resolve_start_offset(10, 10, 20) == 10
    assert resolve_start_offset(15, 10, 20) == 15
    assert resolve_start_offset(20, 10, 20) == 20
    assert resolve_start_offset(-5, 10, 20) == 15
    assert resolve_start_offset(-50, 10, 20) == 10


@pytest.mark.parametrize(("requested", "newest"), [(9, 19), (21, 19)])
def test_offsets_outside_the_retained_range_raise_with_oldest_and_newest(requested, newest):
    with pytest.raises(OffsetOutOfRange) as info:
        resolve_start_offset(requested, 10, 20)
    assert (info.value.requested, info.value.oldest, info.value.newest) == (requested, 10, newest)


def test_keys_route_like_synap():
    assert partition_for_key("customer-123", 3) == zlib.crc32(b"customer-123") % 3
    assert {partition_for_key(f"user-{i}", 4) for i in range(100)} == {0, 1, 2, 3}
    assert partition_for_key("same", 7) == partition_for_key(b"same", 7)
