"""The human tables of the client commands. Pure."""

from __future__ import annotations

from meshplane.cli.tables import group_stats, table, topic_stats


def test_columns_line_up_and_missing_values_show_as_a_dash() -> None:
    assert (
        table(("A", "LONGER"), [(1, None), ("wide value", 2)])
        == "A           LONGER\n1           -\nwide value  2"
    )


def test_topic_and_group_stats() -> None:
    topic = {
        "topic": "t",
        "num_partitions": 2,
        "retention_policy": {"type": "Infinite"},
        "partitions": [
            {
                "partition_id": 0,
                "min_offset": 0,
                "next_offset": 5,
                "message_count": 5,
                "total_bytes": 280,
                "segments": 1,
            },
            {
                "partition_id": 1,
                "min_offset": 2,
                "next_offset": 3,
                "message_count": 1,
                "total_bytes": 56,
                "segments": 1,
            },
        ],
    }
    assert topic_stats(topic).splitlines()[1:] == [
        "PARTITION  OLDEST  NEXT  EVENTS  BYTES  SEGMENTS",
        "0          0       5     5       280    1",
        "1          2       3     1       56     1",
    ]
    group = {
        "group_id": "g",
        "topic": "t",
        "state": "Stable",
        "generation": 3,
        "member_count": 1,
        "strategy": "sticky",
        "partition_count": 2,
        "assignment": {"m1": [1]},
        "committed": {"1": 7},
        "lag": {"0": 4, "1": 0},
    }
    assert group_stats(group).splitlines() == [
        "group g on t: Stable, generation 3, 1 member(s), sticky",
        "PARTITION  MEMBER  COMMITTED  LAG",
        "0          -       -          4",
        "1          m1      7          0",
    ]
