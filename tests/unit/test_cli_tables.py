"""The human tables of the client commands. Pure."""

from __future__ import annotations

from meshplane.cli.tables import group_stats, table, topic_readers, topic_stats


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


def test_mesh_status_reads_as_one_line_per_link_and_gateway() -> None:
    from meshplane.cli.tables import render_status

    link = {
        "peer": "b",
        "state": "up",
        "patterns_remote": 3,
        "events_out": 10,
        "events_in": 2,
        "batches_out": 4,
        "dropped_peer_down": 1,
        "resyncs": 0,
        "bloom_false_positives": 5,
    }
    status = {
        "node": "a",
        "cluster": "c1",
        "route_url": "tcp://127.0.0.1:16501",
        "clients": [{"id": "c1"}],
        "interest": {"subscriptions_local": 2, "patterns_local": 1, "subscriptions_remote": 3},
        "counters": {"messages_routed": 12, "messages_forwarded": 10, "fanout_avg": 1.0},
        "links": [link],
        "gateways": [{**link, "cluster": "c2", "state": "down"}],
    }
    text = render_status(status)
    lines = text.splitlines()
    assert lines[0].startswith(
        "node a (cluster c1) at tcp://127.0.0.1:16501: 1 clients, 2 local subscriptions"
    )
    assert lines[1].split()[:3] == ["PEER", "STATE", "INTEREST"]
    assert lines[2].split() == ["b", "up", "3", "10", "2", "4", "1", "0", "5"]
    assert lines[3].split() == ["cluster", "c2", "down", "3", "10", "2", "4", "1", "0", "-"]
    no_links = render_status({**status, "links": [], "gateways": []})
    assert no_links.endswith("no links (start the node with --routes, or --gateway)")


def test_mesh_queues_read_as_a_table_of_queues_and_one_of_spools() -> None:
    from meshplane.cli.tables import mesh_queues

    answer = {
        "queues": [{"name": "orders", "patterns": ["orders.>", "refunds.*"], "stored": 7, "duplicates": 1}],
        "spools": [{"peer": "b", "pending": 3, "bytes": 4096, "acked": 12, "refused": 0}],
    }
    assert mesh_queues(answer).splitlines() == [
        "QUEUE   PATTERNS            STORED  DUPLICATES",
        "orders  orders.> refunds.*  7       1",
        "",
        "SPOOL FOR  PENDING  BYTES  CONFIRMED  REFUSED",
        "b          3        4096   12         0",
    ]


def test_room_history_reads_as_one_row_per_event_with_its_data_as_compact_json() -> None:
    from meshplane.cli.tables import room_history

    event = {"offset": 0, "event": "msg", "data": {"text": "hi"}, "timestamp_ms": 1795499161436}
    long = {"offset": 1, "event": "note", "data": "y" * 200, "timestamp_ms": 1795499161808}
    answer = {"room": "chat", "events": [event, long], "oldest_offset": 0, "next_offset": 2}
    lines = room_history(answer).splitlines()
    assert lines[0] == "room chat: offsets 0-1 of 0-1 (next 2)"
    assert lines[1].split() == ["OFFSET", "TIME", "EVENT", "DATA"]
    assert lines[2].split() == ["0", "2026-11-24T05:46:01.436Z", "msg", '{"text":"hi"}']
    assert lines[3].endswith('"' + "y" * 58 + "…")  # long data is cut, so a row stays one line
    empty = room_history({"room": "chat", "events": [], "oldest_offset": 0, "next_offset": 0})
    assert empty == "room chat: no events in this range (next offset 0)"


def test_membership_answers_read_as_one_sentence() -> None:
    from meshplane.cli.tables import membership

    joined = {"member_id": "x", "group_id": "g", "generation": 2, "partitions": [1, 3]}
    assert membership(joined) == "member x of group g, generation 2: partitions 1, 3"
    assert membership({**joined, "partitions": []}) == "member x of group g, generation 2: no partitions"
    assert membership({"success": True, "member_id": "x", "generation": 2, "partitions": [1]}) == (
        "member x, generation 2: partitions 1"
    )


def test_room_stats_read_as_aligned_fields() -> None:
    from meshplane.cli.tables import fields

    lines = fields({"room": "chat", "message_count": 2, "retention_secs": 86400.0}).splitlines()
    assert lines == ["room            chat", "message_count   2", "retention_secs  86400.0"]


def test_cells_and_titles_never_show_python_reprs() -> None:
    """Issue 35: `topic stats` showed `retention {'type': 'Infinite'}`."""
    from meshplane.cli.tables import fields, plain, plural

    title = topic_stats(
        {"topic": "t", "num_partitions": 0, "retention_policy": {"type": "Infinite"}, "partitions": []}
    ).splitlines()[0]
    assert title == "topic t: 0 partitions, retention infinite"
    assert plain({"type": "Time", "retention_secs": 60}) == "time retention_secs=60"
    assert plain({"a": [1, "b"]}) == '{"a":[1,"b"]}'
    assert plain(None) == "-"
    assert fields({"subscribers": ["x"], "retention": {"type": "Size", "max_bytes": 9}}).splitlines() == [
        'subscribers  ["x"]',
        "retention    size max_bytes=9",
    ]
    assert (plural(1, "event"), plural(0, "event"), plural(7, "event")) == ("1 event", "0 events", "7 events")


def test_a_topics_readers_read_as_one_row_per_reader_and_partition() -> None:
    answer = {
        "topic": "t",
        "readers": [
            {
                "reader": "spark-a",
                "offsets": {"0": 5, "1": 2},
                "lag": {"0": 0, "1": 7},
                "updated_secs_ago": 3.2,
            },
        ],
    }
    assert topic_readers(answer).splitlines() == [
        "topic t: 1 reader",
        "READER   PARTITION  OFFSET  LAG  RECORDED",
        "spark-a  0          5       0    3s ago",
        "spark-a  1          2       7    3s ago",
    ]
    assert "no readers" in topic_readers({"topic": "t", "readers": []})
