"""How meshplane's names and limits map onto JetStream's (pure), and the partition bounds' arithmetic."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.streamlog import RetentionPolicy
from meshplane.streams.config import NAME_PATTERN
from meshplane.streams.jetstream import naming
from meshplane.streams.jetstream.store import StreamBounds
from meshplane.streams.jetstream.topics import JetStreamPartition

names = st.from_regex(NAME_PATTERN, fullmatch=True)
SUBJECT_TOKEN = re.compile(r"[^.*> \t\r\n]+")
KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")


@given(names, st.integers(0, 9999))
def test_every_valid_name_maps_to_valid_jetstream_names_and_back(name: str, partition: int) -> None:
    escaped = naming.escape(name)
    assert naming.unescape(escaped) == name
    assert SUBJECT_TOKEN.fullmatch(escaped)  # one subject token, one stream-name part
    assert KV_KEY.fullmatch(escaped)
    assert ".." not in escaped
    assert not escaped.startswith(".")
    stream = naming.partition_stream(name, partition)
    assert not set(stream) & set(".*> /\\")
    assert naming.parse_notice(naming.notice_subject(name, partition)) == (name, partition)


def test_names_that_differ_only_where_jetstream_is_strict_stay_apart() -> None:
    assert len({naming.partition_stream(n, 0) for n in ("a.b", "a:b", "a=2Eb", "a_b")}) == 4


def test_a_subject_that_is_no_notice_is_ignored() -> None:
    for subject in ("meshplane.streams.t.x.0", "meshplane.streams.n.x", "meshplane.streams.n.x.y", "other"):
        assert naming.parse_notice(subject) is None


def test_retention_maps_to_stream_limits_and_none_means_unlimited() -> None:
    assert naming.retention_limits(RetentionPolicy()) == {"max_age": 0.0, "max_bytes": -1, "max_msgs": -1}
    combined = RetentionPolicy(retention_secs=60.0, max_bytes=1 << 20, max_messages=500)
    assert naming.retention_limits(combined) == {"max_age": 60.0, "max_bytes": 1 << 20, "max_msgs": 500}


def test_offsets_are_sequences_minus_one_and_an_emptied_stream_starts_at_its_end() -> None:
    assert (StreamBounds().start_offset, StreamBounds().next_offset) == (0, 0)
    assert (StreamBounds(1, 10, 10).start_offset, StreamBounds(1, 10, 10).next_offset) == (0, 10)
    trimmed = StreamBounds(4, 10, 7)
    assert (trimmed.start_offset, trimmed.next_offset) == (3, 10)
    purged = StreamBounds(11, 10, 0)
    assert (purged.start_offset, purged.next_offset) == (10, 10)


def test_a_partition_view_moves_forward_only() -> None:
    view = JetStreamPartition()
    view.saw_sequence(1)
    assert (view.start_offset, view.next_offset) == (0, 1)
    view.saw_sequence(5)
    assert (view.start_offset, view.next_offset) == (0, 5)
    view.saw_sequence(3)  # a late notice
    assert view.next_offset == 5
    view.saw(StreamBounds(2, 4, 3))  # an older stream-info answer
    assert view.next_offset == 5
    view.saw(StreamBounds(3, 8, 6, 600))
    assert (view.start_offset, view.next_offset, view.size_bytes) == (2, 8, 600)


vpns = st.one_of(st.just("default"), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", fullmatch=True))


def _matches(pattern: str, subject: str) -> bool:
    """NATS matching of a pattern ending in ``>`` (the only kind the servers subscribe with)."""
    return subject.startswith(pattern.removesuffix(">")) and len(subject) > len(pattern) - 1


@given(vpns, vpns, names, names, st.integers(0, 99))
def test_two_vpns_names_and_subjects_never_meet(one: str, other: str, a: str, b: str, partition: int) -> None:
    x, y = naming.Naming(one), naming.Naming(other)
    same = (one, a) == (other, b)
    assert (x.partition_stream(a, partition) == y.partition_stream(b, partition)) == same
    assert (x.room_stream(a) == y.room_stream(b)) == same
    assert (x.partition_subject(a, partition) == y.partition_subject(b, partition)) == same
    assert (x.topics_bucket == y.topics_bucket) == (one == other)
    # Each server subscribes to its VPN's notices, room feed and pub/sub: never another VPN's.
    assert _matches(x.notices, y.notice_subject(b, partition)) == (one == other)
    assert _matches(x.room_feed, y.room_feed_subject(b)) == (one == other)
    assert y.pubsub_prefix.startswith(x.pubsub_prefix) == (one == other)
    assert x.parse_notice(y.notice_subject(b, partition)) == ((b, partition) if one == other else None)
    assert x.parse_room_feed(y.room_feed_subject(b)) == (b if one == other else None)
    # A room stream's subject never lies under another VPN's topic or room subjects.
    assert not y.room_subject(b).startswith(x.subject_prefix + ".")


def test_the_default_vpns_names_are_those_it_always_had() -> None:
    default = naming.DEFAULT_NAMING
    assert default.partition_stream("orders", 1) == "MESHPLANE_T_orders_1"
    assert default.partition_subject("orders", 1) == "meshplane.streams.t.orders.1"
    assert default.room_stream("chat") == "MESHPLANE_R_chat"
    assert (default.topics_bucket, default.groups_bucket, default.rooms_bucket) == (
        "MESHPLANE_TOPICS",
        "MESHPLANE_GROUPS",
        "MESHPLANE_ROOMS",
    )
    assert (default.notices, default.room_feed, default.pubsub_prefix) == (
        "meshplane.streams.n.>",
        "meshplane.streams.rf.>",
        "meshplane.streams.ps.",
    )
