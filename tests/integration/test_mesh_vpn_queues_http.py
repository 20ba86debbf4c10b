"""A Message VPN's mesh queues over HTTP (issue 58): a VPN's token makes, lists, pauses, deletes and
reads its VPN's queues under the names its clients use (``orders``, not ``A:orders``), and never
another VPN's (404); its scopes apply to the queues' names; the default VPN's operator works in any
VPN with ``X-Meshplane-Vpn`` and sees every queue as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshplane.launchers import StreamsServerProcess
from meshplane.mesh.client import MeshClient
from tests.support.mesh import queue_bodies

A = "team-a-admin-token-0001"
A_READ = "team-a-reader-token-002"
A_ORDERS = "team-a-orders-token-003"
B = "team-b-admin-token-0004"
OPERATOR = "default-operator-token-5"
TOKENS = f"""
[tokens.a]
token = "{A}"
vpn = "A"
[tokens.a-reader]
token = "{A_READ}"
vpn = "A"
scopes = ["read"]
[tokens.a-orders]
token = "{A_ORDERS}"
vpn = "A"
scopes = ["admin:orders"]
[tokens.b]
token = "{B}"
vpn = "B"
[tokens.operator]
token = "{OPERATOR}"
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamsServerProcess]:
    root: Path = tmp_path_factory.mktemp("vpn-queues")
    (root / "vpns.toml").write_text("[vpns.A]\n[vpns.B]\n")
    (root / "tokens.toml").write_text(TOKENS)
    files = ("--mesh-vpns", str(root / "vpns.toml"), "--token-file", str(root / "tokens.toml"))
    # A free route port: the default (16500) is taken while another suite or node runs on the host.
    with StreamsServerProcess(extra_args=("--node-id", "a", "--route-port", "0", *files)) as proc:
        yield proc.start()
        proc.stop()
        assert "Traceback" not in proc.log_path.read_text()


async def _call(
    node: StreamsServerProcess,
    method: str,
    path: str,
    token: str,
    body: dict[str, Any] | None = None,
    vpn: str | None = None,
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", **({"X-Meshplane-Vpn": vpn} if vpn else {})}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, node.url + path, json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json()


async def _names(node: StreamsServerProcess, token: str, vpn: str | None = None) -> list[str]:
    status, body = await _call(node, "GET", "/mesh/queues", token, vpn=vpn)
    assert status == 200, body
    return [queue["name"] for queue in body["queues"]]


async def _put(node: StreamsServerProcess, name: str, token: str, **body: Any) -> tuple[int, Any]:
    return await _call(node, "PUT", f"/mesh/queues/{name}", token, {"patterns": ["orders.>"], **body})


async def _read(node: StreamsServerProcess, name: str, token: str) -> list[bytes]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        return await queue_bodies(node, name, http)


async def test_a_vpns_token_makes_lists_and_reads_its_queue_by_its_own_name(
    node: StreamsServerProcess,
) -> None:
    status, made = await _put(node, "orders", A)
    assert status == 200, made
    assert (made["name"], made["vpn"], made["topic"]) == ("orders", "A", "orders")
    assert (await _put(node, "orders", B))[0] == 200  # B's queue of the same name: another queue
    assert await _names(node, A) == ["orders"]
    assert await _names(node, A_READ) == ["orders"]

    in_a = await MeshClient(node.route_url, vpn="A").connect()
    in_b = await MeshClient(node.route_url, vpn="B").connect()
    try:
        sent = [b"a%d" % i for i in range(20)]
        for body in sent:
            await in_a.publish("orders.eu", body, guaranteed=True)  # returns once stored
        await in_b.publish("orders.eu", b"b-secret", guaranteed=True)
    finally:
        await in_a.close()
        await in_b.close()
    assert await _read(node, "orders", A) == sent
    assert await _read(node, "orders", A_READ) == sent
    assert await _read(node, "orders", B) == [b"b-secret"]
    status, page = await _call(node, "POST", "/topics/orders/partitions/0/consume", A, {"limit": 1})
    assert status == 200, page
    assert page["topic"] == page["events"][0]["topic"] == "orders"  # named as A names it
    status, stats = await _call(node, "GET", "/topics/orders/stats", A)
    assert status == 200, stats
    assert stats["topic"] == "orders"  # as A names it
    assert sum(p["message_count"] for p in stats["partitions"]) == len(sent)


async def test_a_vpns_token_cannot_see_delete_pause_or_read_anothers_queue(
    node: StreamsServerProcess,
) -> None:
    assert (await _put(node, "b-only", B))[0] == 200
    assert "b-only" not in await _names(node, A)
    for method, path in (
        ("DELETE", "/mesh/queues/b-only"),
        ("POST", "/mesh/queues/b-only/pause"),
        ("POST", "/mesh/queues/b-only/resume"),
        ("POST", "/mesh/queues/B:b-only/pause"),
        ("GET", "/topics/b-only/stats"),
        ("GET", "/topics/B:b-only/stats"),
    ):
        status, body = await _call(node, method, path, A, {})
        assert status == 404, (method, path, body)
    status, body = await _call(node, "POST", "/topics/b-only/partitions/0/consume", A, {"from_offset": 0})
    assert status == 404, body
    status, body = await _put(node, "b-only", A, vpn="B")  # naming B's VPN: refused
    assert status == 403, body
    status, body = await _call(node, "DELETE", "/mesh/queues/b-only?vpn=B", A)
    assert status == 403, body
    status, body = await _put(node, "B:b-only", A)  # ':' is a VPN's separator, never in a VPN's names
    assert status == 400, body
    assert "b-only" in await _names(node, B)  # B's queue is as it was
    status, body = await _call(node, "GET", "/mesh", A)  # every VPN's clients, users and patterns
    assert status == 403, body


async def test_a_vpns_scopes_apply_to_its_queue_names(node: StreamsServerProcess) -> None:
    status, body = await _put(node, "reads", A_READ)  # read scope: reads, makes nothing
    assert status == 403, body
    status, body = await _put(node, "payments", A_ORDERS)  # admin over orders* only
    assert status == 403, body
    status, made = await _put(node, "orders-eu", A_ORDERS)
    assert status == 200, made
    status, paused = await _call(node, "POST", "/mesh/queues/orders-eu/pause", A_ORDERS)
    assert (status, paused) == (200, {"name": "orders-eu", "paused": True})
    status, body = await _call(node, "DELETE", "/mesh/queues/orders-eu", A_READ)
    assert status == 403, body
    status, body = await _call(node, "DELETE", "/mesh/queues/orders-eu", A_ORDERS)
    assert (status, body) == (200, {"deleted": "orders-eu"})
    status, body = await _call(node, "DELETE", "/mesh/queues/orders-eu", A_ORDERS)
    assert status == 404, body
    status, body = await _call(node, "POST", "/topics/ledger", A, {"num_partitions": 1})
    assert status == 201, body
    status, body = await _put(node, "ledger", A)  # A's topic of that name: not a queue's too
    assert status == 409, body
    status, body = await _call(node, "POST", "/mesh/vpns/reload", A)  # the node's VPNs: the operator's
    assert status == 403, body


async def test_the_operator_sees_every_queue_and_works_in_any_vpn(node: StreamsServerProcess) -> None:
    status, made = await _put(node, "ops", OPERATOR, vpn="A")  # as before VPN tokens: the body's VPN
    assert (status, made["topic"]) == (200, "A:ops")
    status, made = await _call(node, "PUT", "/mesh/queues/ops2", OPERATOR, {"patterns": ["x.>"]}, vpn="A")
    assert (status, made["topic"]) == (200, "ops2")  # in A, with the header: named as A names it
    assert {"ops", "ops2"} <= set(await _names(node, A))
    assert {"A:ops", "A:ops2"} <= set(await _names(node, OPERATOR))
    assert "ops" in await _names(node, OPERATOR, vpn="A")
    status, body = await _call(node, "DELETE", "/mesh/queues/ops2", OPERATOR, vpn="A")
    assert status == 200, body
    assert "ops2" not in await _names(node, A)


async def _publish(node: StreamsServerProcess, vpn: str, subject: str, bodies: list[bytes]) -> None:
    client = await MeshClient(node.route_url, vpn=vpn).connect()
    try:
        for body in bodies:
            await client.publish(subject, body, guaranteed=True)  # returns once stored
    finally:
        await client.close()


async def test_a_vpns_token_runs_a_consumer_group_on_its_queue_by_its_own_name(
    node: StreamsServerProcess,
) -> None:
    assert (await _call(node, "PUT", "/mesh/queues/jobs", A, {"patterns": ["jobs.>"]}))[0] == 200
    await _publish(node, "A", "jobs.x", [b"j%d" % i for i in range(5)])
    status, made = await _call(node, "POST", "/consumer-groups/workers", A, {"topic": "jobs"})
    assert status == 201, made
    assert (made["group_id"], made["topic"], made["partition_count"]) == ("workers", "jobs", 1)
    status, joined = await _call(node, "POST", "/consumer-groups/workers/join", A, {})
    assert status == 200, joined
    assert (joined["group_id"], joined["partitions"]) == ("workers", [0])
    member, generation = joined["member_id"], joined["generation"]
    status, page = await _call(node, "POST", "/topics/jobs/partitions/0/consume", A, {"from_offset": 0})
    assert status == 200, page
    assert len(page["events"]) == 5, page
    commit = {"partition_id": 0, "offset": 3, "member_id": member, "generation": generation}
    status, body = await _call(node, "POST", "/consumer-groups/workers/offsets/commit", A, commit)
    assert status == 200, body
    status, offset = await _call(node, "GET", "/consumer-groups/workers/offsets/0", A)
    assert (status, offset["offset"]) == (200, 3), offset
    status, stats = await _call(node, "GET", "/consumer-groups/workers/stats", A)
    assert status == 200, stats
    assert (stats["group_id"], stats["topic"], stats["lag"]) == ("workers", "jobs", {"0": 2})
    status, groups = await _call(node, "GET", "/consumer-groups", A)
    assert status == 200, groups
    assert "workers" in groups["groups"], groups
    status, groups = await _call(node, "GET", "/consumer-groups", OPERATOR)
    assert "A:workers" in groups["groups"], groups  # the default VPN's stored name, as the topic's

    # Another VPN's token: A's queue and its group are unknown to it.
    status, groups = await _call(node, "GET", "/consumer-groups", B)
    assert "workers" not in groups["groups"], groups
    for method, path in (
        ("POST", "/consumer-groups/workers/join"),
        ("GET", "/consumer-groups/workers/stats"),
        ("GET", "/consumer-groups/workers/offsets/0"),
        ("DELETE", "/consumer-groups/workers"),
        ("GET", "/consumer-groups/A:workers/stats"),
    ):
        status, body = await _call(node, method, path, B, {})
        assert status == 404, (method, path, body)
    status, body = await _call(node, "POST", "/consumer-groups/workers", B, {"topic": "jobs"})
    assert status == 404, body
    status, body = await _call(node, "POST", "/consumer-groups/w2", B, {"topic": "A:jobs"})
    assert status in (400, 404), body

    # A group of A's own topic may not take the queue group's name, nor the queue group an own group's.
    assert (await _call(node, "POST", "/topics/own", A, {"num_partitions": 1}))[0] == 201
    status, body = await _call(node, "POST", "/consumer-groups/workers", A, {"topic": "own"})
    assert status == 409, body
    assert (await _call(node, "POST", "/consumer-groups/mine", A, {"topic": "own"}))[0] == 201
    status, body = await _call(node, "POST", "/consumer-groups/mine", A, {"topic": "jobs"})
    assert status == 409, body
    status, body = await _call(node, "DELETE", "/consumer-groups/workers", A)
    assert (status, body) == (200, {"success": True, "group_id": "workers"})
    assert "A:workers" not in (await _call(node, "GET", "/consumer-groups", OPERATOR))[1]["groups"]


async def test_a_vpns_topic_list_shows_its_queues_by_their_names_and_no_other_vpns(
    node: StreamsServerProcess,
) -> None:
    assert (await _call(node, "PUT", "/mesh/queues/listed-a", A, {"patterns": ["la.>"]}))[0] == 200
    assert (await _call(node, "PUT", "/mesh/queues/listed-b", B, {"patterns": ["lb.>"]}))[0] == 200
    status, listed = await _call(node, "GET", "/topics", A)
    assert status == 200, listed
    assert "listed-a" in listed["topics"], listed
    assert listed["count"] == len(listed["topics"])
    assert not any(name.startswith("listed-b") or ":" in name for name in listed["topics"]), listed
    status, listed = await _call(node, "GET", "/topics", B)
    assert "listed-b" in listed["topics"], listed
    assert "listed-a" not in listed["topics"], listed
    status, listed = await _call(node, "GET", "/topics", A_ORDERS)  # its scopes apply: orders* only
    assert status == 200, listed
    assert "listed-a" not in listed["topics"], listed
    status, listed = await _call(node, "GET", "/topics", OPERATOR)
    assert {"A:listed-a", "B:listed-b"} <= set(listed["topics"]), listed


async def _commands(node: StreamsServerProcess, token: str, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """Each command's answer envelope: the first over ``POST /api/v1/command``, the rest over one
    command WebSocket (``/api/v1/ws``), so both channels are exercised."""
    (first, first_payload), rest = calls[0], calls[1:]
    answers = []
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        envelope = {"command": first, "request_id": "0", "payload": first_payload}
        async with http.post(node.url + "/api/v1/command", json=envelope) as answer:
            answers.append(await answer.json())
        async with http.ws_connect(node.url + "/api/v1/ws") as ws:
            for n, (command, payload) in enumerate(rest, 1):
                await ws.send_json({"command": command, "request_id": str(n), "payload": payload})
                answers.append(await ws.receive_json(timeout=30))
    return answers


def _lag(exposition: str) -> dict[tuple[str, str], float]:
    """meshplane_group_lag by (vpn, group), from a /metrics answer."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.labels.get("vpn", "default"), sample.labels["group"]): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "meshplane_group_lag"
    }


async def _metrics(node: StreamsServerProcess, token: str) -> str:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http,
        http.get(node.url + "/metrics") as answer,
    ):
        assert answer.status == 200
        return await answer.text()


async def test_the_command_channel_runs_a_vpns_group_on_its_queue_as_the_rest_routes_do(
    node: StreamsServerProcess,
) -> None:
    assert (await _call(node, "PUT", "/mesh/queues/tasks", A, {"patterns": ["tasks.>"]}))[0] == 200
    await _publish(node, "A", "tasks.x", [b"t%d" % i for i in range(3)])
    status, made = await _call(node, "POST", "/consumer-groups/crew", A, {"topic": "tasks"})
    assert status == 201, made
    (joined,) = await _commands(node, A, ("group.join", {"group": "crew"}))
    assert joined["success"], joined
    assert (joined["payload"]["group_id"], joined["payload"]["partitions"]) == ("crew", [0])
    member, generation = joined["payload"]["member_id"], joined["payload"]["generation"]
    mine = {"group": "crew", "member_id": member}
    commit = {**mine, "partition_id": 0, "offset": 2, "generation": generation}
    answers = await _commands(
        node,
        A,
        ("group.heartbeat", mine),
        ("group.assignment", mine),
        ("group.commit", commit),
        ("group.offset", {"group": "crew", "partition_id": 0}),
    )
    assert all(answer["success"] for answer in answers), answers
    assert answers[1]["payload"]["group_id"] == "crew"
    assert answers[2]["payload"]["offset"] == 2
    assert (answers[3]["payload"]["group_id"], answers[3]["payload"]["offset"]) == ("crew", 2)
    status, offset = await _call(node, "GET", "/consumer-groups/crew/offsets/0", A)  # the same group
    assert (status, offset["offset"]) == (200, 2), offset

    # Another VPN's token: A's queue group is unknown to it, by A's name or the stored one.
    for group in ("crew", "A:crew"):
        answers = await _commands(
            node, B, ("group.join", {"group": group}), ("group.offset", {"group": group, "partition_id": 0})
        )
        assert [(a["success"], a["code"]) for a in answers] == [(False, 404)] * 2, answers
    (reset,) = await _commands(
        node, A_READ, ("group.commit", {"group": "crew", "partition_id": 0, "offset": 0})
    )
    assert (reset["success"], reset["code"]) == (False, 403), reset  # a reset needs admin, as on REST
    (left,) = await _commands(node, A, ("group.leave", mine))
    assert left["success"], left


async def test_a_queue_groups_lag_is_in_metrics_under_its_vpn_and_its_vpns_names(
    node: StreamsServerProcess,
) -> None:
    assert (await _call(node, "PUT", "/mesh/queues/lagging", A, {"patterns": ["lag.>"]}))[0] == 200
    assert (await _call(node, "PUT", "/mesh/queues/lagging", B, {"patterns": ["lag.>"]}))[0] == 200
    await _publish(node, "A", "lag.x", [b"l%d" % i for i in range(4)])
    await _publish(node, "B", "lag.x", [b"m%d" % i for i in range(6)])
    assert (await _call(node, "POST", "/consumer-groups/slow", A, {"topic": "lagging"}))[0] == 201
    assert (await _call(node, "POST", "/consumer-groups/slow-b", B, {"topic": "lagging"}))[0] == 201
    seen_by_a = _lag(await _metrics(node, A))
    assert seen_by_a.get(("A", "slow")) == 4, seen_by_a
    assert not [key for key in seen_by_a if key[0] != "A" or ":" in key[1]], seen_by_a
    seen_by_b = _lag(await _metrics(node, B))
    assert seen_by_b.get(("B", "slow-b")) == 6, seen_by_b
    assert not [key for key in seen_by_b if key[0] != "B" or ":" in key[1]], seen_by_b
    seen_by_operator = _lag(await _metrics(node, OPERATOR))
    assert (seen_by_operator[("A", "slow")], seen_by_operator[("B", "slow-b")]) == (4, 6), seen_by_operator
    assert not [key for key in seen_by_operator if ":" in key[1]], seen_by_operator
    assert ("A", "slow") not in _lag(await _metrics(node, A_ORDERS))  # its scopes: orders* only


async def test_a_vpns_groups_on_its_queues_count_against_its_own_max_groups(tmp_path: Path) -> None:
    """A's groups on its mesh queues are stored in the default VPN's service: they were counted
    against the default VPN's limit, not A's (A made 3 with ``max_groups = 1``, and filled the default
    VPN's 3 so that its operator could make none). Now A's own limit holds them, the default's is
    untouched."""
    (tmp_path / "vpns.toml").write_text("[vpns.A]\nmax_groups = 1\n[vpns.B]\n")
    (tmp_path / "tokens.toml").write_text(TOKENS)
    files = ("--mesh-vpns", str(tmp_path / "vpns.toml"), "--token-file", str(tmp_path / "tokens.toml"))
    with StreamsServerProcess(
        extra_args=("--node-id", "a", "--route-port", "0", *files, "--max-groups", "3")
    ) as proc:
        node = proc.start()
        assert (await _call(node, "PUT", "/mesh/queues/jobs", A, {"patterns": ["jobs.>"]}))[0] == 200
        await _publish(node, "A", "jobs.x", [b"j"])
        made = [(await _call(node, "POST", f"/consumer-groups/w{i}", A, {"topic": "jobs"})) for i in range(3)]
        assert [status for status, _ in made] == [201, 429, 429], made
        assert made[1][1]["limit"] == "groups", made
        assert (await _call(node, "POST", "/topics/mine", OPERATOR, {"num_partitions": 1}))[0] == 201
        for i in range(3):
            status, body = await _call(node, "POST", f"/consumer-groups/op{i}", OPERATOR, {"topic": "mine"})
            assert status == 201, body
        status, body = await _call(node, "POST", "/consumer-groups/w9", A, {"topic": "jobs"})
        assert status == 429, body


async def test_a_vpns_queues_never_use_up_the_default_vpns_topics(tmp_path: Path) -> None:
    """A's queue topics live in the default VPN's store (``A:q0``) but are bounded by the queue limits:
    under ``--max-topics 2`` A makes 3 queues and the operator still makes its 2 topics (a third is
    refused), also after a SIGKILL and restart."""
    (tmp_path / "vpns.toml").write_text("[vpns.A]\n[vpns.B]\n")
    (tmp_path / "tokens.toml").write_text(TOKENS)
    files = ("--mesh-vpns", str(tmp_path / "vpns.toml"), "--token-file", str(tmp_path / "tokens.toml"))
    limits = ("--max-topics", "2", "--max-partitions", "2")
    with StreamsServerProcess(extra_args=("--node-id", "a", "--route-port", "0", *files, *limits)) as proc:
        node = proc.start()
        for i in range(3):
            status, body = await _call(node, "PUT", f"/mesh/queues/q{i}", A, {"patterns": [f"q{i}.>"]})
            assert status == 200, body
        for name in ("mine", "mine2"):
            status, body = await _call(node, "POST", f"/topics/{name}", OPERATOR, {"num_partitions": 1})
            assert status == 201, body
        status, body = await _call(node, "POST", "/topics/mine3", OPERATOR, {"num_partitions": 1})
        assert (status, body.get("limit")) == (429, "topics"), body
        proc.kill()
        node = proc.start()
        status, body = await _call(node, "PUT", "/mesh/queues/q3", A, {"patterns": ["q3.>"]})
        assert status == 200, body
        status, body = await _call(node, "POST", "/topics/mine3", OPERATOR, {"num_partitions": 1})
        assert (status, body.get("limit")) == (429, "topics"), body
        status, body = await _call(node, "DELETE", "/topics/mine2", OPERATOR)
        assert status in (200, 204), body
        status, body = await _call(node, "POST", "/topics/mine3", OPERATOR, {"num_partitions": 1})
        assert status == 201, body
