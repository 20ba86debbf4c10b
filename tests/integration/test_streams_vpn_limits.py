"""The streams side's count limits per Message VPN (issue 58): each VPN's topics, partitions, rooms
and consumer groups are counted against its own limits, serve's flags or what its section of the VPN
file sets (again at a reload); a refusal is a 429 naming the limit, counted by VPN and limit in
``/metrics`` and ``GET /storage``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshplane.launchers import NatsServer, StreamsServerProcess

A = "team-a-limits-token-0001"
B = "team-b-limits-token-0002"
OPERATOR = "default-limits-operator-3"
TOKENS = f"""
[tokens.a]
token = "{A}"
vpn = "A"
[tokens.b]
token = "{B}"
vpn = "B"
[tokens.operator]
token = "{OPERATOR}"
"""
VPNS = "[vpns.A]\nmax_topics = 1\nmax_rooms = 1\nmax_groups = 1\nmax_partitions = 3\n[vpns.B]\n"
FLAGS = ("--max-topics", "2", "--max-rooms", "2", "--max-groups", "2", "--max-partitions", "100")


def _server(root: Path, *more: str) -> StreamsServerProcess:
    (root / "vpns.toml").write_text(VPNS)
    (root / "tokens.toml").write_text(TOKENS)
    files = ("--mesh-vpns", str(root / "vpns.toml"), "--token-file", str(root / "tokens.toml"))
    return StreamsServerProcess(extra_args=(*files, *FLAGS, *more))


@pytest.fixture(scope="module", params=["local", "jetstream"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamsServerProcess]:
    """A streams-only server (no mesh), on either storage backend."""
    with contextlib.ExitStack() as stack:
        more: tuple[str, ...] = ()
        if request.param == "jetstream":
            more = ("--storage", stack.enter_context(NatsServer(jetstream=True)).start().url)
        proc = stack.enter_context(_server(tmp_path_factory.mktemp("vpn-limits"), *more))
        yield proc.start()
        proc.stop()
        assert "Traceback" not in proc.log_path.read_text()


async def _call(
    server: StreamsServerProcess, method: str, path: str, token: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http,
        http.request(method, server.url + path, json=body) as answer,
    ):
        return answer.status, await (
            answer.json() if answer.content_type == "application/json" else answer.text()
        )


async def _made(server: StreamsServerProcess, token: str, kind: str, names: list[str]) -> list[int]:
    """The statuses of making each of ``names``: a topic, a room or a group (on the topic ``t0``)."""
    made: dict[str, tuple[str, dict[str, Any]]] = {
        "topic": ("/topics/{}", {"num_partitions": 1}),
        "room": ("/stream/{}", {}),
        "group": ("/consumer-groups/{}", {"topic": "t0"}),
    }
    path, body = made[kind]
    return [(await _call(server, "POST", path.format(name), token, body))[0] for name in names]


def _refused(metrics: str, vpn: str, limit: str) -> float:
    found = re.search(
        rf'meshplane_limits_refused_total\{{(?=[^}}]*limit="{limit}")(?=[^}}]*vpn="{vpn}")[^}}]*\}} (\S+)',
        metrics,
    )
    return float(found[1]) if found else 0.0


async def test_each_vpn_counts_its_own_topics_rooms_and_groups_against_its_own_limits(
    server: StreamsServerProcess,
) -> None:
    # B has serve's flags (2 each), A its VPN file's (1 each), the default VPN the flags: apart.
    assert await _made(server, B, "topic", ["t0", "t1", "t2"]) == [201, 201, 429]
    assert await _made(server, A, "topic", ["t0", "t1"]) == [201, 429]
    assert await _made(server, OPERATOR, "topic", ["t0", "t1", "t2"]) == [201, 201, 429]
    assert await _made(server, A, "room", ["r0", "r1"]) == [201, 429]
    assert await _made(server, B, "room", ["r0", "r1", "r2"]) == [201, 201, 429]
    assert await _made(server, A, "group", ["g0", "g1"]) == [201, 429]
    assert await _made(server, B, "group", ["g0", "g1", "g2"]) == [201, 201, 429]
    status, body = await _call(server, "POST", "/topics/wide", A, {"num_partitions": 4})
    assert status == 429, body  # A's topic limit says first

    status, body = await _call(server, "POST", "/topics/t9", A, {"num_partitions": 1})
    assert status == 429, body
    assert (body["type"], body["limit"]) == ("LimitReached", "topics")
    assert "1 topics" in body["error"], body  # the reason, with the VPN's own limit
    status, body = await _call(server, "POST", "/consumer-groups/g9", A, {"topic": "t0"})
    assert (status, body["limit"]) == (429, "groups"), body

    status, storage = await _call(server, "GET", "/storage", A)
    assert status == 200, storage
    assert storage["limits"]["topics"] == {"used": 1, "limit": 1}
    assert storage["limits"]["groups"] == {"used": 1, "limit": 1}
    assert storage["limits_refused"] == {"topics": 3, "rooms": 1, "groups": 2}
    status, metrics = await _call(server, "GET", "/metrics", OPERATOR)
    assert status == 200
    assert _refused(metrics, "A", "topics") == 3
    assert _refused(metrics, "B", "topics") == _refused(metrics, "default", "topics") == 1
    assert _refused(metrics, "B", "rooms") == 1
    status, metrics = await _call(server, "GET", "/metrics", A)  # a VPN's token: its own counts only
    assert _refused(metrics, "A", "topics") == 3
    assert 'vpn="B"' not in metrics


async def test_a_vpns_partitions_are_bounded_by_its_own_limit(tmp_path: Path) -> None:
    with _server(tmp_path) as proc:
        server = proc.start()
        status, body = await _call(server, "POST", "/topics/wide", A, {"num_partitions": 4})
        assert (status, body["limit"]) == (429, "partitions"), body
        assert (await _call(server, "POST", "/topics/wide", B, {"num_partitions": 4}))[0] == 201
        assert (await _call(server, "POST", "/topics/narrow", A, {"num_partitions": 3}))[0] == 201
        status, body = await _call(server, "POST", "/topics/narrow/partitions", A, {"num_partitions": 4})
        assert (status, body["limit"]) == (429, "partitions"), body


async def test_a_reload_of_the_vpn_file_changes_a_vpns_streams_limits(tmp_path: Path) -> None:
    with _server(tmp_path, "--node-id", "a") as proc:  # a mesh node: its VPN file reloads
        server = proc.start()
        assert await _made(server, A, "topic", ["t0", "t1"]) == [201, 429]
        (tmp_path / "vpns.toml").write_text(VPNS.replace("max_topics = 1", "max_topics = 3"))
        status, body = await _call(server, "POST", "/mesh/vpns/reload", OPERATOR)
        assert (status, body["ok"]) == (200, True), body
        assert await _made(server, A, "topic", ["t1", "t2", "t3"]) == [201, 201, 429]
        (tmp_path / "vpns.toml").write_text(VPNS.replace("max_topics = 1\n", ""))  # serve's flag again
        assert (await _call(server, "POST", "/mesh/vpns/reload", OPERATOR))[0] == 200
        status, storage = await _call(server, "GET", "/storage", A)
        assert storage["limits"]["topics"] == {"used": 3, "limit": 2}, storage  # lowered: nothing dropped
        assert await _made(server, A, "topic", ["t4"]) == [429]
        proc.stop()
        assert "Traceback" not in proc.log_path.read_text()
