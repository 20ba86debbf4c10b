"""`meshplane topic consume` and `meshplane group consume` against a real server, as kcat users expect."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.helpers import read_until, wait_until
from tests.support.cli import MESHPLANE, streams_env


@pytest.fixture(scope="module")
def server() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess() as proc:
        yield proc.start()


def publish(url: str, topic: str, values: range, partitions: int = 3) -> None:
    async def go() -> None:
        async with StreamsClient(url) as client:
            if topic not in await client.topics():
                await client.create_topic(topic, partitions)
            if values:
                events = [{"event_type": "e", "key": f"k{i}", "data": i} for i in values]
                await client.publish_batch(topic, events)

    asyncio.run(go())


def consume(server: StreamsServerProcess, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [*MESHPLANE, "topic", "consume", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=streams_env(server),
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_topic_consume_reads_every_partition_from_where_it_is_told(server: StreamsServerProcess) -> None:
    publish(server.url, "kc", range(30))
    everything = consume(server, "kc", "-e")
    assert sorted(e["data"] for e in everything) == list(range(30))
    assert {e["partition"] for e in everything} == {0, 1, 2}
    last_two = consume(server, "kc", "-e", "-o", "-2")
    assert len(last_two) == 6  # the last two of each of three partitions
    only_one = consume(server, "kc", "-e", "-p", "1")
    assert {e["partition"] for e in only_one} == {1}
    assert len(consume(server, "kc", "-e", "-c", "4")) == 4
    time.sleep(0.005)
    since = time.time_ns() // 1_000_000
    time.sleep(0.005)
    publish(server.url, "kc", range(30, 35))
    later = consume(server, "kc", "-e", "-o", f"s@{since}")
    assert sorted(e["data"] for e in later) == list(range(30, 35))
    assert consume(server, "kc", "-e", "-o", "end") == []


def test_topic_consume_follows_new_events(server: StreamsServerProcess) -> None:
    publish(server.url, "follow", range(3))
    proc = subprocess.Popen(
        [*MESHPLANE, "topic", "consume", "follow", "-c", "5"],
        stdout=subprocess.PIPE,
        text=True,
        env=streams_env(server),
    )
    publish(server.url, "follow", range(3, 5))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert sorted(json.loads(line)["data"] for line in out.splitlines()) == list(range(5))


def test_two_group_members_share_the_partitions_and_commit(server: StreamsServerProcess) -> None:
    publish(server.url, "shared", range(0), partitions=4)

    async def make_group() -> None:
        async with StreamsClient(server.url) as client:
            await client.create_group("sharers", "shared", session_timeout_secs=10)

    asyncio.run(make_group())
    members = [
        subprocess.Popen(
            [*MESHPLANE, "group", "consume", "sharers"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=streams_env(server),
        )
        for _ in range(2)
    ]

    async def assignment() -> dict[str, Any]:
        async with StreamsClient(server.url) as client:
            return await client.group_stats("sharers")

    wait_until(
        lambda: sorted(len(ps) for ps in asyncio.run(assignment())["assignment"].values()) == [2, 2],
        timeout=30,
        interval=0.2,
        what="two members with two partitions each",
    )
    publish(server.url, "shared", range(40), partitions=4)

    async def committed() -> int:
        async with StreamsClient(server.url) as client:
            return sum([await client.committed("sharers", p) or 0 for p in range(4)])

    wait_until(lambda: asyncio.run(committed()) == 40, timeout=30, interval=0.2, what="all 40 committed")
    outputs = []
    for member in members:
        member.send_signal(signal.SIGINT)
        out, _ = member.communicate(timeout=30)
        outputs.append([json.loads(line) for line in out.splitlines()])
    assert all(outputs), "each member consumed some partitions"
    assert sorted(e["data"] for out in outputs for e in out) == list(range(40))  # once each
    partitions = [{e["partition"] for e in out} for out in outputs]
    assert not partitions[0] & partitions[1]
    assert asyncio.run(assignment())["members"] == []  # both left on Ctrl-C


def test_keyed_produce_from_stdin(server: StreamsServerProcess) -> None:
    publish(server.url, "produced", range(0), partitions=3)
    lines = "".join(f'customer-{i % 2}:{{"n": {i}}}\n' for i in range(6)) + "\n" + "customer-1:plain\n"
    result = subprocess.run(
        [*MESHPLANE, "topic", "produce", "produced", "-K", ":"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        env=streams_env(server),
    )
    assert result.returncode == 0, result.stderr
    assert "published 7 events to produced" in result.stderr
    events = consume(server, "produced", "-e")
    by_key: dict[str, set[int]] = {}
    for e in events:
        by_key.setdefault(e["key"], set()).add(e["partition"])
    assert all(len(partitions) == 1 for partitions in by_key.values())  # a key keeps its partition
    assert sorted(str(e["data"]) for e in events) == sorted([str({"n": i}) for i in range(6)] + ["plain"])
    broken = subprocess.run(
        [*MESHPLANE, "topic", "produce", "produced", "-K", ":"],
        input="no delimiter here\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=streams_env(server),
    )
    assert broken.returncode == 2
    assert "line 1 has no key delimiter ':'" in broken.stderr


def shown_at_a_terminal(command: list[str], server: StreamsServerProcess) -> bytes:
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            command, stdout=follower, stderr=subprocess.PIPE, timeout=60, env=streams_env(server)
        )
        os.close(follower)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the terminal's writer is gone
            while chunk := os.read(leader, 65536):
                shown += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    return shown


@pytest.mark.timeout(200)  # its waits add up to 180 s
def test_answers_are_tables_at_a_terminal_and_json_otherwise(server: StreamsServerProcess) -> None:
    publish(server.url, "shown", range(3), partitions=2)
    command = [*MESHPLANE, "topic", "stats", "shown"]
    assert b"PARTITION  OLDEST  NEXT" in shown_at_a_terminal(command, server)
    piped = subprocess.run(command, capture_output=True, text=True, timeout=60, env=streams_env(server))
    assert json.loads(piped.stdout)["topic"] == "shown"
    for data in ('{"text": "hi"}', '"plain"'):
        published = subprocess.run(
            [*MESHPLANE, "stream", "publish", "lobby", "msg", data], env=streams_env(server), timeout=60
        )
        assert published.returncode == 0
    history = shown_at_a_terminal([*MESHPLANE, "stream", "history", "lobby"], server).decode()
    assert "OFFSET  TIME" in history
    assert '{"text":"hi"}' in history
    assert '"plain"' in history


def test_topic_readers_shows_a_spark_querys_place_and_lag(server: StreamsServerProcess) -> None:
    """A reader records its offsets as the Spark source does after a batch; the CLI shows its lag."""
    publish(server.url, "read-by-spark", range(5), partitions=1)
    put = urllib.request.Request(
        f"{server.url}/topics/read-by-spark/readers/spark-nightly",
        data=json.dumps({"offsets": {"0": 2}}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(put, timeout=10) as response:
        assert response.status == 200
    command = [*MESHPLANE, "topic", "readers", "read-by-spark"]
    piped = subprocess.run(command, capture_output=True, text=True, timeout=60, env=streams_env(server))
    (reader,) = json.loads(piped.stdout)["readers"]
    assert (reader["reader"], reader["offsets"], reader["lag_total"]) == ("spark-nightly", {"0": 2}, 3)
    table = shown_at_a_terminal(command, server).decode()
    assert "READER         PARTITION  OFFSET  LAG" in table
    assert "spark-nightly  0          2       3" in table


def _group(server: StreamsServerProcess, group: str, topic: str) -> None:
    async def make() -> None:
        async with StreamsClient(server.url) as client:
            await client.create_group(group, topic, session_timeout_secs=60)

    asyncio.run(make())


def _committed(server: StreamsServerProcess, group: str, partitions: int) -> int:
    async def total() -> int:
        async with StreamsClient(server.url) as client:
            return sum([await client.committed(group, p) or 0 for p in range(partitions)])

    return asyncio.run(total())


@pytest.mark.timeout(200)  # its waits add up to 180 s
def test_group_consume_commits_exactly_what_it_printed(server: StreamsServerProcess) -> None:
    """Issue 35: `-c 5` printed 5 events and committed 500; the next `-c 2` started at 500."""
    publish(server.url, "counted", range(500), partitions=1)
    _group(server, "counters", "counted")
    seen: list[int] = []
    for count in (5, 2, 3):
        result = subprocess.run(
            [*MESHPLANE, "group", "consume", "counters", "-c", str(count)],
            capture_output=True,
            text=True,
            timeout=60,
            env=streams_env(server),
        )
        assert result.returncode == 0, result.stderr
        printed = [json.loads(line)["data"] for line in result.stdout.splitlines()]
        assert len(printed) == count
        seen += printed
        assert _committed(server, "counters", 1) == len(seen)  # committed = handed over
    assert seen == list(range(10))  # nothing skipped, nothing twice


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP])
def test_group_consume_leaves_its_group_on_sigterm_and_sighup(
    server: StreamsServerProcess, stop_signal: int
) -> None:
    topic = f"leaving-{int(stop_signal)}"
    publish(server.url, topic, range(20), partitions=2)
    _group(server, topic, topic)
    member = subprocess.Popen(
        [*MESHPLANE, "group", "consume", topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=streams_env(server),
    )

    wait_until(lambda: _committed(server, topic, 2) == 20, timeout=30, interval=0.2, what="all 20 read")
    assert len(_members(server, topic)) == 1
    member.send_signal(stop_signal)
    member.communicate(timeout=30)
    assert _members(server, topic) == []  # it left at once: no session timeout to wait for


@pytest.mark.timeout(170)  # its waits add up to 150 s
def test_group_consume_count_says_it_waits_for_the_rest_and_e_stops_at_the_end(
    server: StreamsServerProcess,
) -> None:
    """Issue 57: the README's `group consume billing --topic orders -c 10` waited forever (as kcat does)
    on a topic with fewer events, without a word."""
    publish(server.url, "few", range(3), partitions=2)
    member = subprocess.Popen(
        [*MESHPLANE, "group", "consume", "billing-few", "--topic", "few", "-c", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=streams_env(server),
    )
    try:
        said = read_until(member.stderr, "waiting for", 60, "group consume at the end")
        assert "at the end of few after 3 of 10 events: waiting for more (-e exits at the end)" in said[-1]
        assert member.poll() is None  # it waits, as kcat -c does
    finally:
        member.send_signal(signal.SIGINT)
        member.communicate(timeout=30)
    publish(server.url, "few", range(3, 5))
    result = subprocess.run(
        [*MESHPLANE, "group", "consume", "billing-few", "-c", "10", "-e"],
        capture_output=True,
        text=True,
        timeout=60,
        env=streams_env(server),
    )
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(line)["data"] for line in result.stdout.splitlines()) == [3, 4]
    assert "waiting for" not in result.stderr


def _group_member(
    server: StreamsServerProcess, group: str, *, sigint_ignored: bool = False
) -> subprocess.Popen[str]:
    """``group consume GROUP``; ``sigint_ignored``: started as a script's background job is (``cmd &``)."""
    argv = [*MESHPLANE, "group", "consume", group]
    return subprocess.Popen(
        started_with_sigint_ignored(argv) if sigint_ignored else argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=streams_env(server),
    )


def started_with_sigint_ignored(argv: list[str]) -> list[str]:
    """``argv`` run as a script's background job runs (``cmd &``): SIGINT ignored, which exec keeps. Not
    a ``preexec_fn``: Python in the forked child of this process, whose other threads (gRPC's) may hold
    locks, crashed it (a segfault in a pytest-xdist worker, the member never started)."""
    return ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]


def _members(server: StreamsServerProcess, group: str) -> list[Any]:
    async def members() -> list[Any]:
        async with StreamsClient(server.url) as client:
            return list((await client.group_stats(group))["members"])

    return asyncio.run(members())


def test_group_consume_leaves_on_sigint_even_when_started_with_it_ignored(
    server: StreamsServerProcess,
) -> None:
    """A script's background job (and so a test run started as one) inherits SIGINT ignored; `kill -INT`
    must still stop a member as SIGTERM does. It was ignored: the two SIGINT tests above waited 30 s."""
    publish(server.url, "ignored-int", range(6), partitions=2)
    _group(server, "ignored-int", "ignored-int")
    member = _group_member(server, "ignored-int", sigint_ignored=True)
    try:
        wait_until(
            lambda: _committed(server, "ignored-int", 2) == 6, timeout=30, interval=0.2, what="all 6 read"
        )
        member.send_signal(signal.SIGINT)
        out, err = member.communicate(timeout=30)
    finally:
        member.kill()
    assert member.returncode == 130, err
    assert sorted(json.loads(line)["data"] for line in out.splitlines()) == list(range(6))
    assert "stopped by SIGINT after 6 events, each committed before it was printed; left the group" in err
    assert _members(server, "ignored-int") == []


def test_group_consume_stops_within_a_bound_on_ctrl_c_while_its_server_does_not_answer() -> None:
    """Ctrl-C while the server is paused: the leave on the way out is bounded (it waited the client's 30 s
    request timeout), and the member says it could not leave."""
    with StreamsServerProcess() as proc:
        paused = proc.start()
        publish(paused.url, "paused", range(4), partitions=1)
        _group(paused, "paused", "paused")
        member = _group_member(paused, "paused")
        try:
            wait_until(
                lambda: _committed(paused, "paused", 1) == 4, timeout=30, interval=0.2, what="all 4 read"
            )
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                member.send_signal(signal.SIGINT)
                started = time.monotonic()
                _, err = member.communicate(timeout=60)
                took = time.monotonic() - started
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        finally:
            member.kill()
        assert member.returncode == 130, err
        # its leave has 5 s (it had the client's 30 s request timeout): 20 leaves room for a loaded machine
        assert took < 20, f"{took:.1f}s after Ctrl-C: {err}"
        assert "stopped by SIGINT after 4 events" in err
        assert "could not leave the group within 5s" in err


def test_topic_consume_stops_on_sigint_even_when_started_with_it_ignored(
    server: StreamsServerProcess,
) -> None:
    publish(server.url, "ignored-int-topic", range(3), partitions=1)
    reader = subprocess.Popen(
        started_with_sigint_ignored([*MESHPLANE, "topic", "consume", "ignored-int-topic"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=streams_env(server),
    )
    try:
        printed = read_until(reader.stdout, r'"data": 2\b', 60, "topic consume's third event")
        reader.send_signal(signal.SIGINT)
        _, err = reader.communicate(timeout=30)
    finally:
        reader.kill()
    assert [json.loads(line)["data"] for line in printed] == [0, 1, 2]
    assert reader.returncode == 130, err
    assert "stopped by SIGINT after 3 events" in err
