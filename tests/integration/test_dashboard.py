"""The dashboard's HTTP side on a real ``meshplane serve``: the page, its data, its live stream, bad
requests and tokens. (test_dashboard_browser.py drives it in a real browser.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from meshplane.core.records import key_to_file_name
from meshplane.dashboard.meshview import node_key
from meshplane.launchers import StreamsServerProcess
from tests.helpers import wait_until
from tests.support.servers import start_together

TOKEN = "dashboard-admin-token-0123"
READER = "orders-reader-token-0123456"


def publish(url: str, topic: str, n: int, partition: int = 0, **headers: str) -> None:
    body: dict[str, Any] = {
        "events": [{"event_type": "e", "data": {"i": i}} for i in range(n)],
        "partition": partition,
    }
    requests.post(f"{url}/topics/{topic}/publish", json=body, headers=headers, timeout=5).raise_for_status()


def sse_events(response: requests.Response, count: int) -> list[tuple[str, bytes]]:
    """The first ``count`` events of a server-sent event stream (keep-alive comments skipped)."""
    found: list[tuple[str, bytes]] = []
    event = b""
    for line in response.iter_lines():
        if line.startswith(b"event: "):
            event = line[7:]
        elif line.startswith(b"data: "):
            found.append((event.decode(), line[6:]))
            if len(found) == count:
                break
    return found


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with StreamsServerProcess() as proc:
        base = proc.start().url
        requests.post(f"{base}/topics/orders", json={"num_partitions": 2}, timeout=5).raise_for_status()
        yield base


def test_the_page_and_its_assets_are_public_with_a_content_security_policy(url: str) -> None:
    for path in ("/ui", "/ui/groups/g1", "/ui/topics/a%20b"):
        page = requests.get(url + path, timeout=5)
        assert page.status_code == 200
        assert '<script type="module" src="/ui/static/app.js">' in page.text
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    script = requests.get(f"{url}/ui/static/app.js", timeout=5)
    assert script.headers["Content-Type"].startswith("text/javascript")
    assert "uPlot" in script.text
    assert requests.get(f"{url}/ui/static/vendor/uPlot.LICENSE.txt", timeout=5).text.startswith("The MIT")
    for missing in ("/ui/static/nope.js", "/ui/static/..%2f..%2fhttp.py", "/ui/static/index.html"):
        assert requests.get(url + missing, timeout=5).status_code == 404


def test_the_snapshot_and_the_live_stream_carry_the_state(url: str) -> None:
    publish(url, "orders", 3, partition=1)
    snapshot = requests.get(f"{url}/ui/api/snapshot", timeout=5).json()
    (orders,) = [t for t in snapshot["topics"] if t["name"] == "orders"]
    assert [p["next"] for p in orders["partitions"]][1] >= 3
    assert {"in", "out", "bytes_in"} <= set(snapshot["history"])
    assert snapshot["overview"]["counters"]["events_published"] >= 3
    with requests.get(f"{url}/ui/api/live", stream=True, timeout=5) as live:
        assert live.headers["Content-Type"] == "text/event-stream"
        frames = sse_events(live, 3)  # the first state, then one a tick
    assert [kind for kind, _ in frames] == ["state"] * 3
    assert b'"history"' in frames[0][1]
    assert b'"history"' not in frames[1][1]


def test_bulk_reads_show_as_reads_not_as_nothing(url: str) -> None:
    """Issue 35: the dashboard said "events out/s 0" while Spark read (its reads are raw records)."""
    publish(url, "orders", 50, partition=0)

    def bulk() -> int:
        overview = requests.get(f"{url}/ui/api/snapshot", timeout=5).json()["overview"]
        return int(overview["counters"]["bytes_read_in_bulk"])

    before = bulk()
    raw = requests.get(f"{url}/topics/orders/partitions/0/records?from_offset=0", timeout=5)
    located = requests.get(
        f"{url}/topics/orders/partitions/0/records/location?from_offset=0", timeout=5
    ).json()
    assert bulk() == before + len(raw.content) + located["length"]
    wait_until(
        lambda: (
            requests.get(f"{url}/ui/api/snapshot", timeout=5).json()["overview"]["bulk_bytes_out_per_sec"] > 0
        ),
        timeout=30,
        what="the bulk read rate",
    )


def test_the_live_stream_tails_new_events_of_a_partition(url: str) -> None:
    end = requests.get(f"{url}/topics/orders/stats", timeout=5).json()["partitions"][0]["next_offset"]
    with requests.get(
        f"{url}/ui/api/live", params={"tail": "topic:orders:0"}, stream=True, timeout=5
    ) as live:
        publish(url, "orders", 2, partition=0)
        tails = []
        for kind, data in sse_events(live, 10):
            if kind == "tail":
                tails.append(data)
                break
    assert tails
    assert f'"offset":{end},'.encode() in tails[0]
    assert b'"payload":{"format":"json"' in tails[0]


def test_the_browser_pages_and_jumps_to_a_time(url: str) -> None:
    publish(url, "orders", 5, partition=1)
    middle = int(time.time() * 1000)
    publish(url, "orders", 5, partition=1)
    everything = requests.get(
        f"{url}/ui/api/browse", params={"target": "topic:orders:1", "limit": "500"}, timeout=5
    )
    events = everything.json()["events"]
    first_late = next(e["offset"] for e in events if e["timestamp_ms"] >= middle)
    jumped = requests.get(
        f"{url}/ui/api/browse", params={"target": "topic:orders:1", "timestamp_ms": str(middle)}, timeout=5
    ).json()
    assert jumped["from_offset"] == first_late
    assert jumped["events"][0]["offset"] == first_late
    last = requests.get(
        f"{url}/ui/api/browse", params={"target": "topic:orders:1", "limit": "2"}, timeout=5
    ).json()
    assert [e["offset"] for e in last["events"]] == [last["end"] - 2, last["end"] - 1]


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({}, 400),
        ({"target": "topics:orders"}, 400),
        ({"target": "topic:orders:x"}, 400),
        ({"target": "topic:nope:0"}, 404),
        ({"target": "topic:orders:7"}, 404),
        ({"target": "room:nope"}, 404),
        ({"target": "topic:orders:0", "limit": "0"}, 400),
        ({"target": "topic:orders:0", "limit": "100000"}, 400),
        ({"target": "topic:orders:0", "from_offset": "-3"}, 400),
        ({"target": "topic:orders:0", "timestamp_ms": "soon"}, 400),
    ],
)
def test_bad_browse_and_tail_requests_are_4xx_with_a_reason(
    url: str, params: dict[str, str], status: int
) -> None:
    answer = requests.get(f"{url}/ui/api/browse", params=params, timeout=5)
    assert answer.status_code == status
    assert answer.json()["error"]
    if "target" in params and "limit" not in params and "timestamp_ms" not in params:
        tail = requests.get(f"{url}/ui/api/live", params={"tail": params["target"], **params}, timeout=5)
        assert tail.status_code == status


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tokens: Path = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"{READER} read:orders\n")
    with StreamsServerProcess(
        extra_args=("--token-file", str(tokens)), env={"MESHPLANE_STREAMS_TOKEN": TOKEN}
    ) as proc:
        base = proc.start().url
        admin = {"Authorization": f"Bearer {TOKEN}"}
        for topic in ("orders", "billing"):
            requests.post(f"{base}/topics/{topic}", json={"num_partitions": 1}, headers=admin, timeout=5)
        yield base


def test_with_tokens_the_data_and_the_live_stream_refuse_without_one(guarded: str) -> None:
    assert requests.get(f"{guarded}/ui", timeout=5).status_code == 200  # the page holds no data
    for path in ("/ui/api/snapshot", "/ui/api/live", "/ui/api/browse?target=topic:orders:0"):
        assert requests.get(guarded + path, timeout=5).status_code == 401
        wrong = {"Authorization": "Bearer not-the-token-at-all"}
        assert requests.get(guarded + path, headers=wrong, timeout=5).status_code == 401
        # browsers' EventSource puts tokens in URLs; this stream takes them only from the header
        assert requests.get(guarded + path, params={"access_token": TOKEN}, timeout=5).status_code == 401
    ok = requests.get(f"{guarded}/ui/api/snapshot", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert {t["name"] for t in ok.json()["topics"]} == {"orders", "billing"}


def test_a_token_for_some_names_sees_and_browses_only_those(guarded: str) -> None:
    reader = {"Authorization": f"Bearer {READER}"}
    snapshot = requests.get(f"{guarded}/ui/api/snapshot", headers=reader, timeout=5).json()
    assert [t["name"] for t in snapshot["topics"]] == ["orders"]
    assert snapshot["plane"]["hidden"]
    browse = f"{guarded}/ui/api/browse"
    assert requests.get(browse, params={"target": "topic:orders:0"}, headers=reader, timeout=5).ok
    denied = requests.get(browse, params={"target": "topic:billing:0"}, headers=reader, timeout=5)
    assert denied.status_code == 403
    live = requests.get(
        f"{guarded}/ui/api/live", params={"tail": "topic:billing:0"}, headers=reader, timeout=5
    )
    assert live.status_code == 403


def test_events_read_by_spark_queries_count_as_events_out(url: str) -> None:
    """Issue 57: the Overview said "events out/s 0" while the pipeline read ~600/s: its reads (records
    in bulk, or the segment files themselves) counted no events. They count as the reader says how far
    it got, never past what was written."""
    requests.post(f"{url}/topics/spark-in", json={"num_partitions": 1}, timeout=5).raise_for_status()
    publish(url, "spark-in", 40)

    def at(offset: int) -> None:
        body = {"offsets": {"0": offset}}
        requests.put(f"{url}/topics/spark-in/readers/q1", json=body, timeout=5).raise_for_status()

    def out_rate() -> float:
        overview = requests.get(f"{url}/ui/api/snapshot", timeout=5).json()["overview"]
        return float(overview["events_out_per_sec"])

    at(0)
    at(30)
    wait_until(lambda: out_rate() > 0, timeout=30, what="the reader's events in events out/s")
    at(10**15)  # a reader that says more than was written counts only what was (10 more)
    deadline = time.monotonic() + 3  # the next samples, a second apart
    while time.monotonic() < deadline:
        assert out_rate() < 1000
        time.sleep(0.2)


# --- the mesh view across nodes (issue 57) ----------------------------------------------------------


def test_the_mesh_view_asks_other_nodes_without_credentials_and_skips_bad_records(tmp_path: Path) -> None:
    """Node a (no tokens) draws the view; node b requires a token, which a never sends it; records in
    discovery that are not a node's (not JSON, not an http URL) are left out."""
    kv = tmp_path / "kv"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} admin\n")
    env = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(kv)}
    a = StreamsServerProcess(extra_args=("--node-id", "a", "--cluster", "v", "--route-port", "0"), env=env)
    b = StreamsServerProcess(
        extra_args=("--node-id", "b", "--cluster", "v", "--route-port", "0", "--token-file", str(tokens)),
        env=env,
    )
    with a, b:
        start_together(a, b)
        for node, junk in (
            ("x", b"{not json"),
            ("y", b'{"node": "y", "cluster": "v", "url": "file:///etc/passwd"}'),
        ):
            bucket, name = key_to_file_name(node_key("v", node))
            (kv / bucket).mkdir(parents=True, exist_ok=True)
            (kv / bucket / name).write_bytes(junk)  # fresh: alive for the discovery's ttl

        def view() -> list[dict[str, Any]] | None:
            found: list[dict[str, Any]] | None = (
                requests.get(f"{a.url}/ui/api/snapshot", timeout=5).json()["plane"].get("mesh_nodes")
            )
            return found

        wait_until(lambda: len(view() or []) == 2, timeout=20, what="both nodes in the view")
        seen = {node["node"]: node for node in view() or []}
        assert seen["a"]["self"] is True
        assert seen["a"]["links"] == []
        assert "requires a token" in seen["b"]["error"]
        assert set(seen) == {"a", "b"}
