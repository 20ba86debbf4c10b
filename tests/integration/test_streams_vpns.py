"""Message VPNs on the streams side (issue 58): a token carries its VPN, and the rooms, topics and
consumer groups it names, lists, reads and counts are its VPN's, over HTTP and WebSocket alike; the
default VPN keeps its layout and URLs; a VPN's pub/sub crosses the mesh in its VPN only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from meshplane.cli.main import main
from meshplane.errors import NotFound
from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.mesh.client import MeshClient
from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import StreamError
from meshplane.streams.jetstream import naming
from tests.helpers import eventually
from tests.support.cli import run_cli, streams_env
from tests.support.mesh import Inbox

A = "team-a-admin-token-0001"
A_READ = "team-a-reader-token-002"
B = "team-b-admin-token-0003"
OPERATOR = "default-operator-token-4"
WRITER = "default-writer-token-005"  # the default VPN's, not its operator
TOKENS = f"""
[tokens.a]
token = "{A}"
vpn = "team-a"
[tokens.a-reader]
token = "{A_READ}"
vpn = "team-a"
scopes = ["read"]
[tokens.b]
token = "{B}"
vpn = "team-b"
[tokens.operator]
token = "{OPERATOR}"
[tokens.writer]
token = "{WRITER}"
scopes = ["write"]
"""


def _files(root: Path) -> tuple[str, ...]:
    (root / "vpns.toml").write_text("[vpns.team-a]\n[vpns.team-b]\n")
    (root / "tokens.toml").write_text(TOKENS)
    return ("--mesh-vpns", str(root / "vpns.toml"), "--token-file", str(root / "tokens.toml"))


@pytest.fixture(scope="module", params=["local", "jetstream"])
def nats_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """Every isolation test runs on both storage backends: the local log, and JetStream."""
    if request.param == "local":
        yield None
        return
    with NatsServer(jetstream=True) as server:
        yield server.start().url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, nats_url: str | None) -> Iterator[StreamsServerProcess]:
    storage = ("--storage", nats_url) if nats_url else ()
    with StreamsServerProcess(extra_args=(*_files(tmp_path_factory.mktemp("vpns")), *storage)) as proc:
        yield proc.start()
        proc.stop()
        assert "Traceback" not in proc.log_path.read_text()


async def _jetstream_streams(url: str) -> set[str]:
    nc = await nats.connect(url)
    try:
        return {info.config.name for info in await nc.jetstream().streams_info() if info.config.name}
    finally:
        await nc.close()


@pytest.fixture
async def clients(server: StreamsServerProcess) -> AsyncIterator[dict[str, StreamsClient]]:
    made = {
        name: StreamsClient(server.url, token=token) for name, token in (("a", A), ("b", B), ("op", OPERATOR))
    }
    try:
        yield made
    finally:
        for client in made.values():
            await client.close()


async def _get(
    server: StreamsServerProcess, path: str, token: str, vpn: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", **({"X-Meshplane-Vpn": vpn} if vpn else {})}
    async with aiohttp.ClientSession() as http, http.get(server.url + path, headers=headers) as answer:
        body = await answer.read()
        try:
            return answer.status, json.loads(body)
        except ValueError:
            return answer.status, body.decode()


async def test_one_topic_name_in_two_vpns_is_two_topics_with_two_logs(
    server: StreamsServerProcess, clients: dict[str, StreamsClient], nats_url: str | None
) -> None:
    a, b = clients["a"], clients["b"]
    await a.create_topic("orders", 2)
    await b.create_topic("orders", 1)
    await a.publish_batch("orders", [{"event_type": "e", "data": f"a{i}"} for i in range(3)], partition=0)
    await b.publish_batch("orders", [{"event_type": "e", "data": "b0"}], partition=0)
    in_a = await a.consume_partition("orders", 0, 0, 10)
    in_b = await b.consume_partition("orders", 0, 0, 10)
    assert [e["data"] for e in in_a["events"]] == ["a0", "a1", "a2"]
    assert [e["data"] for e in in_b["events"]] == ["b0"]
    assert len((await a.topic_stats("orders"))["partitions"]) == 2
    assert len((await b.topic_stats("orders"))["partitions"]) == 1
    if nats_url is not None:  # on JetStream: streams of their own
        streams = await _jetstream_streams(nats_url)
        names_a, names_b = naming.Naming("team-a"), naming.Naming("team-b")
        assert {names_a.partition_stream("orders", 0), names_a.partition_stream("orders", 1)} <= streams
        assert names_b.partition_stream("orders", 0) in streams
        assert names_b.partition_stream("orders", 1) not in streams
        assert naming.partition_stream("orders", 0) not in streams  # the default VPN has no such topic
        return
    root = server.data_dir
    assert (root / "vpns" / "team-a" / "topics" / "orders").is_dir()
    assert (root / "vpns" / "team-b" / "topics" / "orders").is_dir()
    assert not (root / "topics" / "orders").exists()  # the default VPN has no such topic


async def test_a_vpns_token_cannot_list_read_write_or_delete_anothers_objects(
    server: StreamsServerProcess, clients: dict[str, StreamsClient]
) -> None:
    a, b, op = clients["a"], clients["b"], clients["op"]
    await a.create_topic("a-ledger", 1)
    await a.publish_batch("a-ledger", [{"event_type": "e", "data": 1}], partition=0)
    await a.create_room("a-room")
    await a.publish("a-room", "said", {"secret": 1})
    await a.create_group("a-billing", "a-ledger")
    for client in (b, op):  # team-b's, and the default VPN's (without picking a VPN)
        assert "a-ledger" not in await client.topics()
        assert "a-room" not in await client.rooms()
        assert "a-billing" not in [g["group"] if isinstance(g, dict) else g for g in await _groups(client)]
        with pytest.raises(NotFound):
            await client.topic_stats("a-ledger")
        with pytest.raises(NotFound):
            await client.consume_partition("a-ledger", 0, 0, 10)
        with pytest.raises(NotFound):
            await client.delete_topic("a-ledger")
        with pytest.raises(NotFound):
            await client.group_stats("a-billing")
        with pytest.raises(NotFound):
            await client.history("a-room")
    # Synap's command endpoint, over HTTP and over its WebSocket, answers in the token's VPN too.
    listed = await b.command("stream.list", {})
    assert "a-room" not in listed["rooms"]
    async with aiohttp.ClientSession() as http:
        url = server.url.replace("http", "ws", 1) + "/api/v1/ws"
        async with http.ws_connect(url, params={"access_token": B}) as ws:
            await ws.send_str(json.dumps({"command": "stream.list", "request_id": "1", "payload": {}}))
            answer = json.loads((await ws.receive(timeout=10)).data)
        assert answer["success"], answer
        assert "a-room" not in answer["payload"]["rooms"]
        async with http.ws_connect(url, params={"access_token": A}) as ws:
            await ws.send_str(json.dumps({"command": "stream.list", "request_id": "2", "payload": {}}))
            answer = json.loads((await ws.receive(timeout=10)).data)
        assert "a-room" in answer["payload"]["rooms"]
    # A's objects are all still there, as they were.
    assert "a-ledger" in await a.topics()
    assert [e["data"] for e in (await a.consume_partition("a-ledger", 0, 0, 10))["events"]] == [1]


async def _groups(client: StreamsClient) -> list[Any]:
    answer = await client.request("GET", "/consumer-groups")
    groups: list[Any] = answer["groups"]
    return groups


async def test_room_websocket_subscribers_hear_their_vpns_events_only(
    server: StreamsServerProcess, clients: dict[str, StreamsClient]
) -> None:
    a, b = clients["a"], clients["b"]
    for client in (a, b):
        await client.create_room("lobby")
    heard: dict[str, list[Any]] = {"a": [], "b": []}

    async def listen(name: str, client: StreamsClient) -> None:
        async for event in client.subscribe("lobby", f"sub-{name}"):
            heard[name].append(event["data"])

    tasks = [asyncio.create_task(listen(n, c)) for n, c in (("a", a), ("b", b))]
    try:
        for client in (a, b):

            async def live(client: StreamsClient = client) -> bool:
                return bool((await client.room_stats("lobby"))["live_subscribers"] == 1)

            await eventually(live, what="the room's subscriber is live")
        await b.publish("lobby", "said", "from-b-1")
        await a.publish("lobby", "said", "from-a-1")
        await b.publish("lobby", "said", "from-b-2")
        await a.publish("lobby", "said", "from-a-2")
        await eventually(lambda: len(heard["a"]) >= 2 and len(heard["b"]) >= 2, what="both heard two")
        assert heard == {"a": ["from-a-1", "from-a-2"], "b": ["from-b-1", "from-b-2"]}
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_pubsub_listeners_hear_their_vpns_messages_only(
    server: StreamsServerProcess, clients: dict[str, StreamsClient]
) -> None:
    # On JetStream, servers share pub/sub through NATS: each VPN on subjects of its own.
    async with aiohttp.ClientSession() as http:
        url = server.url.replace("http", "ws", 1) + "/pubsub/ws?topics=alerts.*"
        async with http.ws_connect(url, params={"access_token": B}) as b_listener:
            assert json.loads((await b_listener.receive(timeout=10)).data)["type"] == "connected"
            assert await clients["a"].pubsub_publish("alerts.fire", {"from": "a"}) == 0
            await clients["b"].pubsub_publish("alerts.fire", {"from": "b"})
            first = json.loads((await b_listener.receive(timeout=10)).data)
            assert (first["topic"], first["payload"]) == ("alerts.fire", {"from": "b"})
            await clients["a"].pubsub_publish("alerts.fire", {"from": "a"})
            await clients["b"].pubsub_publish("alerts.fire", {"from": "b-2"})
            second = json.loads((await b_listener.receive(timeout=10)).data)
            assert second["payload"] == {"from": "b-2"}


async def test_a_staged_write_commits_into_its_vpns_topic_only(
    server: StreamsServerProcess, clients: dict[str, StreamsClient]
) -> None:
    a, b = clients["a"], clients["b"]
    for client in (a, b):
        await client.create_topic("sink", 1)
    stage = {"stage": "task-0", "seq": 0, "events": [{"event_type": "e", "data": "staged-a", "partition": 0}]}
    await a.request("POST", "/topics/sink/staged", stage)
    reported = {"idempotency_key": "commit-1", "stages": [{"stage": "task-0", "chunks": 1, "events": 1}]}
    # team-b cannot commit (or abort) team-a's stage: there it is unknown.
    with pytest.raises(StreamError):
        await b.request("POST", "/topics/sink/staged/commit", reported)
    await b.request("POST", "/topics/sink/staged/abort", {"stages": ["task-0"]})
    assert (await a.request("POST", "/topics/sink/staged/commit", reported))["count"] == 1
    assert [e["data"] for e in (await a.consume_partition("sink", 0, 0, 10))["events"]] == ["staged-a"]
    assert (await b.consume_partition("sink", 0, 0, 10))["events"] == []


async def test_groups_lag_and_metrics_are_per_vpn(
    server: StreamsServerProcess, clients: dict[str, StreamsClient]
) -> None:
    a, b = clients["a"], clients["b"]
    for client, count in ((a, 5), (b, 2)):
        await client.create_topic("jobs", 1)
        await client.publish_batch(
            "jobs", [{"event_type": "e", "data": i} for i in range(count)], partition=0
        )
        await client.create_group("workers", "jobs")
    await a.commit("workers", 0, 4)  # A's group; B's of the same name stays where it was
    assert await a.committed("workers", 0) == 4
    assert await b.committed("workers", 0) is None
    assert (await a.group_stats("workers"))["lag"] == {"0": 1}
    assert (await b.group_stats("workers"))["lag"] == {"0": 2}
    status, text = await _get(server, "/metrics", A_READ)
    assert status == 200
    assert 'meshplane_group_lag{group="workers",partition="0",vpn="team-a"} 1.0' in text
    assert "# TYPE meshplane_group_lag gauge" in text  # still an exposition Prometheus reads
    assert 'vpn="team-b"' not in text
    assert 'vpn="default"' not in text
    status, text = await _get(server, "/metrics", B)
    assert 'meshplane_group_lag{group="workers",partition="0",vpn="team-b"} 2.0' in text
    assert 'vpn="team-a"' not in text
    _, text = await _get(server, "/metrics", OPERATOR)  # the operator's scrape: every VPN, labelled
    assert 'vpn="team-a"' in text
    assert 'vpn="team-b"' in text
    assert 'vpn="default"' in text


async def test_an_operator_picks_a_vpn_and_a_tenant_cannot(
    server: StreamsServerProcess, clients: dict[str, StreamsClient]
) -> None:
    await clients["a"].create_topic("picked", 1)
    status, listed = await _get(server, "/topics", OPERATOR, vpn="team-a")
    assert status == 200
    assert "picked" in json.dumps(listed)
    status, listed = await _get(server, "/topics", B, vpn="team-a")
    assert status == 403, listed
    status, listed = await _get(server, "/topics", A_READ, vpn="default")
    assert status == 403, listed
    status, _ = await _get(server, "/topics", OPERATOR, vpn="team-z")
    assert status == 404
    async with StreamsClient(server.url, token=OPERATOR, vpn="team-a", channel=True) as operator:
        assert "picked" in await operator.topics()
        await operator.command("stream.create", {"room": "made-by-the-operator"})  # on the command WebSocket
        assert (await operator.topic_stats("picked"))["topic"] == "picked"
    assert "made-by-the-operator" in await clients["a"].rooms()
    assert "made-by-the-operator" not in await clients["op"].rooms()
    # The dashboard's VPN picker: its choices, and each VPN's page state.
    assert (await _get(server, "/ui/api/vpns", OPERATOR))[1]["vpns"] == ["default", "team-a", "team-b"]
    assert (await _get(server, "/ui/api/vpns", A_READ))[1] == {"vpn": "team-a", "vpns": ["team-a"]}
    _, state = await _get(server, "/ui/api/snapshot", A_READ)
    assert "topics" in state, state
    assert "picked" in [t["name"] for t in state["topics"]]
    _, state = await _get(server, "/ui/api/snapshot", B)
    assert "picked" not in [t["name"] for t in state["topics"]]
    _, state = await _get(server, "/ui/api/snapshot", OPERATOR, vpn="team-a")
    assert "picked" in [t["name"] for t in state["topics"]]


async def test_an_unauthenticated_request_learns_no_vpn_names_from_the_header(
    server: StreamsServerProcess,
) -> None:
    """The public routes take no token: a VPN header there was honoured for a VPN that exists (200)
    and answered 404 for one that does not, so anyone could list the VPNs by guessing."""
    async with aiohttp.ClientSession() as http:
        answers = {}
        for vpn in ("team-a", "team-z"):
            async with http.get(server.url + "/health", headers={"X-Meshplane-Vpn": vpn}) as answer:
                answers[vpn] = answer.status
    assert answers == {"team-a": 403, "team-z": 403}


async def test_the_default_vpn_keeps_its_layout_and_urls(
    server: StreamsServerProcess, clients: dict[str, StreamsClient], nats_url: str | None
) -> None:
    op = clients["op"]
    await op.create_topic("legacy", 1)
    await op.publish_batch("legacy", [{"event_type": "e", "data": "old"}], partition=0)
    if nats_url is None:
        assert (server.data_dir / "topics" / "legacy").is_dir()
    else:
        assert naming.partition_stream("legacy", 0) in await _jetstream_streams(nats_url)
    assert "legacy" not in await clients["a"].topics()
    assert [e["data"] for e in (await op.consume_partition("legacy", 0, 0, 10))["events"]] == ["old"]


# --- where the streams server meets the mesh ------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamsServerProcess]:
    """One mesh node for the module's tests: none changes its configuration, and each closes the
    clients and listeners it opened."""
    args = (*_files(tmp_path_factory.mktemp("node")), "--node-id", "n1", "--route-port", "0")
    with StreamsServerProcess(extra_args=args) as proc:
        yield proc.start()


async def test_a_vpns_pubsub_crosses_the_mesh_in_its_vpn_only(node: StreamsServerProcess) -> None:
    clients = {
        "team-a": await MeshClient(node.route_url, vpn="team-a").connect(),
        "team-b": await MeshClient(node.route_url, vpn="team-b").connect(),
        "default": await MeshClient(node.route_url).connect(),
    }
    inboxes = {vpn: Inbox() for vpn in clients}
    streams = {vpn: StreamsClient(node.url, token=token) for vpn, token in (("team-a", A), ("team-b", B))}
    try:
        for vpn, client in clients.items():
            client.subscribe(">", inboxes[vpn])
            await client.flush(propagated=True)
        async with aiohttp.ClientSession() as http:
            url = node.url.replace("http", "ws", 1) + "/pubsub/ws?topics=orders.*"
            async with http.ws_connect(url, params={"access_token": B}) as b_listener:
                assert json.loads((await b_listener.receive(timeout=10)).data)["type"] == "connected"
                await streams["team-a"].pubsub_publish("orders.new", {"id": "a"})
                await streams["team-b"].pubsub_publish("orders.new", {"id": "b"})
                await eventually(lambda: len(inboxes["team-a"].events) >= 1, what="team-a's client heard")
                await eventually(lambda: len(inboxes["team-b"].events) >= 1, what="team-b's client heard")
                # A mesh client of team-a publishes: team-b's pub/sub listener must not hear it.
                await clients["team-a"].publish("orders.mesh", b'{"id": "from-a-client"}')
                await clients["team-b"].publish("orders.mesh", b'{"id": "from-b-client"}')
                await clients["team-a"].flush(propagated=True)
                await clients["team-b"].flush(propagated=True)
                heard: list[dict[str, Any]] = []
                while len(heard) < 2:
                    heard.append(json.loads((await b_listener.receive(timeout=10)).data))
        for client in clients.values():
            await client.flush(propagated=True)
        for vpn in ("team-a", "team-b"):  # the streams side's message, then the client's own
            (subject, body), mine = inboxes[vpn].events
            assert (subject, json.loads(body)["payload"]) == ("orders.new", {"id": vpn[-1]})
            assert mine == ("orders.mesh", b'{"id": "from-%s-client"}' % vpn[-1].encode())
        assert inboxes["default"].events == []
        assert [(m["topic"], m["payload"]) for m in heard] == [
            ("orders.new", {"id": "b"}),
            ("orders.mesh", {"id": "from-b-client"}),
        ]
    finally:
        for client in clients.values():
            await client.close()
        for each in streams.values():
            await each.close()


async def test_a_vpns_token_sees_no_other_vpns_mesh_state(node: StreamsServerProcess) -> None:
    """``GET /mesh`` lists every VPN's clients, users, queues and patterns: the node's, as the
    ``/mesh/...`` routes are; a VPN's token gets a 403 there, the default VPN's still its view."""
    client = await MeshClient(node.route_url, vpn="team-b").connect()
    try:
        client.subscribe("team-b-secret.>", Inbox())
        await client.flush(propagated=True)
        status, answer = await _get(node, "/mesh?patterns=1", A_READ)
        assert status == 403, answer
        assert "team-b-secret" not in json.dumps(answer)
        status, answer = await _get(node, "/mesh?patterns=1", OPERATOR)
        assert status == 200
        assert "team-b-secret" in json.dumps(answer)
    finally:
        await client.close()


async def test_a_default_vpn_token_reaches_no_vpn_through_its_internal_subjects(
    node: StreamsServerProcess,
) -> None:
    """Inside the mesh VPN team-b's subjects are ``$vpn:team-b.<subject>``: the default VPN's pub/sub
    (a token that is not the operator's) must neither publish there nor listen there."""
    base = node.url.replace("http", "ws", 1) + "/pubsub/ws"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:  # it heard team-b's messages
            await http.ws_connect(base + "?topics=$vpn:team-b.orders.*", params={"access_token": WRITER})
        assert refused.value.status == 400
        async with (
            StreamsClient(node.url, token=WRITER) as writer,
            StreamsClient(node.url, token=B) as b,
            http.ws_connect(base + "?topics=orders.*", params={"access_token": B}) as listener,
        ):
            assert json.loads((await listener.receive(timeout=10)).data)["type"] == "connected"
            with pytest.raises(StreamError, match="reserved"):
                await writer.pubsub_publish("$vpn:team-b.orders.forged", {"id": "forged"})
            await b.pubsub_publish("orders.own", {"id": "own"})  # after it: what the listener hears first
            heard = json.loads((await listener.receive(timeout=10)).data)
            assert (heard["topic"], heard["payload"]) == ("orders.own", {"id": "own"})


async def test_a_default_vpn_queue_name_cannot_name_a_vpns_queue(node: StreamsServerProcess) -> None:
    """team-a's queue ``orders`` is stored as ``team-a:orders``; a default-VPN PUT of that name took
    it over: its patterns became the default VPN's, and team-a's queue filled with their events."""
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        url = node.url + "/mesh/queues/"
        async with http.put(url + "orders", json={"patterns": ["orders.>"], "vpn": "team-a"}) as made:
            assert made.status == 200, await made.text()
        async with http.put(url + "team-a:orders", json={"patterns": ["default.>"]}) as taken:
            assert taken.status == 400, await taken.text()
        async with http.get(url.rstrip("/")) as listed:
            queues = (await listed.json())["queues"]
    assert [(q["name"], q["vpn"], q["patterns"]) for q in queues] == [
        ("team-a:orders", "team-a", ["orders.>"])
    ]


# --- configuration ---------------------------------------------------------------------------------


def test_config_check_refuses_a_token_of_an_unknown_vpn_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _files(tmp_path)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS + '[tokens.stray]\ntoken = "stray-token-00000000"\nvpn = "team-c"\n')
    config = tmp_path / "serve.toml"
    config.write_text(f'token_file = "{tokens}"\n[mesh]\nvpns = "{tmp_path / "vpns.toml"}"\n')
    assert main(["config", "check", str(config)]) == 2
    out = capsys.readouterr().out
    line = TOKENS.count("\n") + 3  # the stray token's vpn = line
    assert f"{tokens}:{line}: unknown VPN 'team-c'" in out, out
    assert "stray-token" not in out  # a token is never printed
    tokens.write_text(TOKENS)
    assert main(["config", "check", str(config)]) == 0, capsys.readouterr().out


def test_serve_refuses_a_token_of_an_unknown_vpn(tmp_path: Path) -> None:
    args = _files(tmp_path)
    (tmp_path / "tokens.toml").write_text(TOKENS.replace('vpn = "team-b"', 'vpn = "team-c"'))
    with StreamsServerProcess(extra_args=args) as proc, pytest.raises(Exception, match="team-c"):
        proc.start(timeout=20)


@pytest.mark.timeout(200)  # its waits add up to 180 s
def test_the_streams_commands_work_in_the_vpn_the_operator_names(server: StreamsServerProcess) -> None:
    """``--vpn`` (or ``$MESHPLANE_STREAMS_VPN``, a context's too) sends ``X-Meshplane-Vpn``: the
    operator's commands act in that VPN; another VPN's token naming it is refused."""
    operator = {**streams_env(server), "MESHPLANE_STREAMS_TOKEN": OPERATOR, "XDG_CONFIG_HOME": "/nonexistent"}

    def listed(env: dict[str, str], *more: str) -> list[str]:
        result = run_cli("topic", "list", "--json", *more, env=env)
        assert result.returncode == 0, result.stderr
        topics: list[str] = json.loads(result.stdout)
        return topics

    made = run_cli("topic", "create", "cli-in-a", "--partitions", "1", "--vpn", "team-a", env=operator)
    assert made.returncode == 0, made.stderr
    assert "cli-in-a" in listed(operator, "--vpn", "team-a")
    assert "cli-in-a" not in listed(operator)  # the default VPN's topics: not team-a's
    assert "cli-in-a" in listed({**operator, "MESHPLANE_STREAMS_VPN": "team-a"})
    as_b = {**operator, "MESHPLANE_STREAMS_TOKEN": B}
    refused = run_cli("topic", "list", "--vpn", "team-a", env=as_b)
    assert refused.returncode != 0
    assert "works in its VPN only" in refused.stderr, refused.stderr
