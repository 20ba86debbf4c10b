"""The merge rule and bounds of retained MQTT messages (meshplane.core.doors.mqtt_retained): the order
in which a node learns records never changes what it ends with, and no sequence of offers, however a
peer makes them, takes a VPN past its share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.doors.mqtt_retained import (
    MAX_SKEW_MS,
    Outcome,
    Record,
    RetainedTable,
    decode_body,
    decode_line,
    encode_body,
    encode_line,
)
from meshplane.core.mesh.vpn import prefix_of

A, B = prefix_of("team-a"), prefix_of("team-b")
NOW = 1_000_000_000

RECORDS = st.builds(
    Record,
    subject=st.sampled_from([f"{p}t.{i}" for p in ("", A, B) for i in range(4)]),
    payload=st.sampled_from([b"", b"x", b"yy", b"zzzz" * 8]),
    qos=st.integers(0, 1),
    at=st.integers(NOW - 5000, NOW),
    origin=st.sampled_from(["a", "b", "c"]),
)


def _state(table: RetainedTable) -> dict[str, Record]:
    return {record.subject: record for record in table.records()}


@given(st.lists(RECORDS, max_size=40), st.randoms(use_true_random=False))
def test_any_order_of_learning_ends_with_the_same_records_the_newest_of_each_topic(
    records: list[Record], random: object
) -> None:
    first, second = RetainedTable(), RetainedTable()
    for record in records:
        first.offer(record, NOW)
    shuffled = list(records)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    for record in shuffled:
        second.offer(record, NOW)
        second.offer(record, NOW)  # a copy learnt twice changes nothing
    assert _state(first) == _state(second)
    newest: dict[str, Record] = {}
    for record in records:
        if record.subject not in newest or record.key() > newest[record.subject].key():
            newest[record.subject] = record
    assert _state(first) == newest


@given(st.lists(RECORDS, max_size=80), st.integers(1, 3))
def test_no_offer_takes_a_vpn_past_its_share(records: list[Record], shares: int) -> None:
    table = RetainedTable(max_count=6, max_bytes=200, max_tombstones=6)
    for record in records:
        outcome = table.offer(record, NOW, shares)
        assert outcome is not Outcome.INVALID
        for vpn in ("default", "team-a", "team-b"):
            live = table.live(vpn)
            assert len(live) == table.live_of[vpn] <= 6 // shares
            assert sum(r.size for r in live) == table.bytes_of[vpn] <= 200 // shares
            assert len(table.tombstones.get(vpn, ())) <= max(6 // shares, 1)
    assert table.entries == len(list(table.records()))


def test_a_clear_wins_over_an_older_copy_until_its_tombstone_expires() -> None:
    table = RetainedTable(tombstone_ttl_ms=10_000)
    assert table.offer(Record("t", b"old", 1, NOW - 10, "a"), NOW) is Outcome.KEPT
    assert table.offer(Record("t", b"", 0, NOW, "b"), NOW) is Outcome.KEPT
    assert table.count == 0
    assert table.offer(Record("t", b"old", 1, NOW - 10, "a"), NOW) is Outcome.STALE  # a stale copy loses
    assert table.expire(NOW + 5000) == 0
    assert table.expire(NOW + 10_001) == 1
    assert table.entries == 0
    assert table.offer(Record("u", b"", 0, NOW, "b"), NOW + 20_000) is Outcome.STALE  # nothing to beat


def test_tombstones_are_bounded_the_oldest_forgotten_first() -> None:
    table = RetainedTable(max_tombstones=3)
    for i in range(5):
        assert table.offer(Record(f"t.{i}", b"", 0, NOW + i, "a"), NOW) is Outcome.KEPT
    assert sorted(table.tombstones["default"]) == ["t.2", "t.3", "t.4"]


def test_a_stamp_far_ahead_or_an_origin_no_node_has_is_refused() -> None:
    table = RetainedTable()
    assert table.offer(Record("t", b"x", 0, NOW + MAX_SKEW_MS + 1, "a"), NOW) is Outcome.INVALID
    assert table.offer(Record("t", b"x", 2, NOW, "a"), NOW) is Outcome.INVALID
    assert table.offer(Record("t", b"x", 0, NOW, ""), NOW) is Outcome.INVALID
    assert table.offer(Record("t", b"x", 0, NOW, "n" * 256), NOW) is Outcome.INVALID
    assert table.entries == 0


def test_this_nodes_next_stamp_follows_the_topics_last_whatever_the_clock() -> None:
    table = RetainedTable()
    table.offer(Record("t", b"x", 0, NOW + 500, "other"), NOW)
    assert table.stamp("t", NOW) == NOW + 501  # a later PUBLISH here wins over what it replaces
    assert table.stamp("u", NOW) == NOW


@given(RECORDS)
def test_lines_and_bodies_read_back_what_was_written(record: Record) -> None:
    assert decode_line(encode_line(record).rstrip(b"\n")) == record
    assert decode_body(record.subject, encode_body(record)) == record
    assert decode_line(encode_line(record)[:-3]) is None  # a torn line


@given(st.binary(max_size=64))
def test_any_bytes_as_a_body_are_a_record_or_refused_never_an_error(body: bytes) -> None:
    record = decode_body("t", body)
    assert record is None or isinstance(record, Record)
