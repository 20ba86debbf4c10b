"""Sharing between Message VPNs on real nodes (issue 58 item 4): VPN A exports ``orders.>`` (to B
only) and ``pay.public.>``; B imports A's ``orders.eu.>`` under ``a`` and ``pay.public.>`` as it is.
An importer gets exactly the exported and imported events, renamed, on one node, across a route and
across a gateway; nothing else crosses (what A does not export, what B does not import, anything of B
into A, anything into C), and the importing user's permissions still apply."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import aiohttp
import nats
import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from meshplane.cli.main import main
from meshplane.errors import PermissionDenied
from meshplane.launchers import MeshCluster, StreamsServerProcess
from meshplane.mesh.client import MeshClient
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.integration.test_mesh_gateways_guaranteed import TwoClusters, all_up, running
from tests.support.cli import MESHPLANE, plane_env
from tests.support.mesh import Inbox, status

CAROL = "carol-pw-3e8a"
SHARING = f"""
[vpns.A]
exports = [
  {{ events = "orders.>", to = ["B"] }},
  {{ events = "pay.public.>" }},
]
[vpns.B]
imports = [
  {{ vpn = "A", events = "orders.eu.>", prefix = "a" }},
  {{ vpn = "A", events = "pay.public.>" }},
]
[vpns.B.users.bea]
password_hash = "{hash_password(CAROL)}"
[vpns.B.users.carol]
password_hash = "{hash_password(CAROL)}"
subscribe = {{ deny = ["a.orders.eu.secret"] }}
[vpns.C]
"""
# What A's publisher sends, and the subjects B's subscriber on '>' sees of it.
PUBLISHED = ("orders.eu.new", "orders.eu.secret", "orders.us.new", "pay.public.x", "pay.private.x", "other")
SEEN_IN_B = {
    "orders.eu.new": "a.orders.eu.new",
    "orders.eu.secret": "a.orders.eu.secret",
    "pay.public.x": "pay.public.x",
}


def vpn_file(tmp_path: Path, text: str = SHARING) -> Path:
    path = tmp_path / "vpns.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshCluster]:
    """One pair for the tests that neither stop nor reload it: their clients close before they end,
    and what they count they count from where it was."""
    with MeshCluster(
        2, extra_args=("--mesh-vpns", str(vpn_file(tmp_path_factory.mktemp("vpns"))))
    ) as cluster:
        yield cluster.start()


async def exchange(publisher_url: str, subscriber_url: str) -> dict[str, Inbox]:
    """B, C and A subscribers on '>' at ``subscriber_url``; A's and B's publishers at ``publisher_url``
    send every subject; each subscriber's events once everything has been handled everywhere."""
    subscribers = {vpn: await connect(subscriber_url, vpn) for vpn in ("B", "C")}
    inboxes = {vpn: Inbox() for vpn in subscribers}
    senders = {vpn: await connect(publisher_url, vpn) for vpn in ("A", "B")}
    try:
        for vpn, client in subscribers.items():
            client.subscribe(">", inboxes[vpn])
            await client.flush(propagated=True)
        await wait_for_interest(senders["A"], inboxes["B"])
        for subject in PUBLISHED:
            await senders["A"].publish(subject, f"A:{subject}".encode())
            await senders["B"].publish(subject, f"B:{subject}".encode())
        await senders["A"].publish("pay.public.end", b"A:end")
        await eventually(
            lambda: any(body == b"A:end" for _, body in inboxes["B"].events), what="A's end in B"
        )
        for client in (*senders.values(), *subscribers.values()):
            await client.flush(propagated=True)
        return inboxes
    finally:
        for client in (*subscribers.values(), *senders.values()):
            await client.close()


async def connect(url: str, vpn: str) -> MeshClient:
    user, password = ("bea", CAROL) if vpn == "B" else ("", None)
    return await MeshClient(url, vpn=vpn, user=user, password=password).connect()


async def wait_for_interest(sender: MeshClient, inbox: Inbox) -> None:
    """A's publisher sends ``pay.public.warm`` until B's subscriber has one: B's interest in A's space
    has reached A's node, across whatever lies between."""

    async def arrived() -> bool:
        await sender.publish("pay.public.warm", b"warm")
        return any(body == b"warm" for _, body in inbox.events)

    await eventually(arrived, timeout=30, what="B's imported interest at A's node")


def assert_only_what_is_shared(inboxes: dict[str, Inbox]) -> None:
    got = {(subject, body) for subject, body in inboxes["B"].events if body not in (b"warm", b"A:end")}
    expected = {(seen, f"A:{subject}".encode()) for subject, seen in SEEN_IN_B.items()}
    expected |= {(subject, f"B:{subject}".encode()) for subject in PUBLISHED}  # B's own, as ever
    assert got == expected
    assert inboxes["C"].events == []


async def test_an_importer_gets_exactly_what_is_exported_and_imported_on_one_node(pair: MeshCluster) -> None:
    await asyncio.to_thread(pair.wait_linked)
    before = await import_counts(pair["a"])
    orders_metric = await import_metric(pair["a"], "a.orders.eu.>")
    assert_only_what_is_shared(await exchange(pair["a"].route_url, pair["a"].route_url))
    # What crossed each import is counted by VPN, in GET /mesh and /metrics.
    rows = {(r["vpn"], r["from"], r["space"]): r for r in (await status(pair["a"]))["imports"]["by_import"]}
    orders, public = ("B", "A", "a.orders.eu.>"), ("B", "A", "pay.public.>")
    assert rows[orders]["events"] - before.get(orders, 0) == 2  # orders.eu.new and .secret, to one subscriber
    assert rows[public]["events"] - before.get(public, 0) >= 3  # pay.public.x, the end and the warm-ups
    assert rows[orders]["kind"] == "events"
    assert await import_metric(pair["a"], "a.orders.eu.>") == orders_metric + 2


async def import_counts(node: StreamsServerProcess) -> dict[tuple[str, str, str], int]:
    """Events across each import so far (the pair is shared: counts go on from the tests before)."""
    rows = (await status(node))["imports"]["by_import"]
    return {(r["vpn"], r["from"], r["space"]): int(r["events"]) for r in rows}


async def import_metric(node: StreamsServerProcess, space: str) -> float:
    """meshplane_mesh_vpn_import_events_total of A's ``space`` into B (0 while none crossed)."""
    series = f'meshplane_mesh_vpn_import_events_total{{from_vpn="A",space="{space}",vpn="B"}} '
    found = [line for line in (await scrape(node)).splitlines() if line.startswith(series)]
    return float(found[0][len(series) :]) if found else 0.0


async def scrape(node: StreamsServerProcess) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{node.url}/metrics") as response:
        return await response.text()


async def test_an_exporters_events_reach_the_importer_once_the_direct_path_knows_their_route(
    pair: MeshCluster,
) -> None:
    """A's clients take the C direct path (A has no users): A's events on an exported subject, sent in
    many reads to a subscriber in A and one in B (through the import) on the same node, reach both,
    every one: a route with an import on it is left to the Python path, which delivers through it."""
    url = pair["a"].route_url
    own, imported = Inbox(), Inbox()
    in_a, in_b, sender = await connect(url, "A"), await connect(url, "B"), await connect(url, "A")
    try:
        in_a.subscribe("orders.eu.>", own)
        in_b.subscribe("a.orders.eu.>", imported)
        for client in (in_a, in_b):
            await client.flush(propagated=True)
        sent = []
        for round_ in range(10):  # one read each, at least: the route is known after the first
            for n in range(50):
                sent.append(b"%d-%d" % (round_, n))
                await sender.publish("orders.eu.new", sent[-1])
            await sender.flush()
        await eventually(lambda: len(own.events) == len(sent), what="A's own events in A")
        await eventually(lambda: len(imported.events) >= len(sent), what="A's events in B")
        assert own.events == [("orders.eu.new", body) for body in sent]
        assert imported.events == [("a.orders.eu.new", body) for body in sent]
    finally:
        for client in (in_a, in_b, sender):
            await client.close()


async def test_an_importer_gets_exactly_what_is_exported_and_imported_across_a_route(
    pair: MeshCluster,
) -> None:
    await asyncio.to_thread(pair.wait_linked)
    assert_only_what_is_shared(await exchange(pair["a"].route_url, pair["b"].route_url))
    # The interest B's subscription drew from A's space (under A's prefix) is given up with it.
    await eventually(partial(knows_none_of_a, pair["a"]), what="b's interest in A's space given up")
    a_client = await MeshClient(pair["a"].route_url, vpn="A").connect()
    try:  # and nothing of B reaches A, whose client has no import
        inbox = Inbox()
        a_client.subscribe(">", inbox)
        await a_client.flush(propagated=True)
        b_client = await connect(pair["b"].route_url, "B")
        await b_client.publish("a.orders.eu.new", b"B into A?")
        await b_client.flush(propagated=True)
        await b_client.close()
        await a_client.flush()
        assert inbox.events == []
    finally:
        await a_client.close()


@pytest.mark.timeout(150)
async def test_an_importer_gets_exactly_what_is_exported_and_imported_across_a_gateway(
    tmp_path: Path,
) -> None:
    with running(TwoClusters(extra_args=("--mesh-vpns", str(vpn_file(tmp_path))))) as topo:
        await all_up(topo)
        assert_only_what_is_shared(await exchange(topo["a2"].route_url, topo["b2"].route_url))


async def test_the_importing_users_permissions_still_apply(pair: MeshCluster) -> None:
    await asyncio.to_thread(pair.wait_linked)
    errors: list[PermissionDenied] = []
    carol = await MeshClient(
        pair["b"].route_url, vpn="B", user="carol", password=CAROL, on_error=errors.append
    ).connect()
    sender = await MeshClient(pair["a"].route_url, vpn="A").connect()
    try:
        wide, narrow = Inbox(), Inbox()
        carol.subscribe("a.>", wide)  # could reach the denied a.orders.eu.secret: refused
        carol.subscribe("a.orders.eu.new", narrow)
        with pytest.raises(PermissionDenied):
            await carol.flush(propagated=True)
        assert [str(e).split("'")[1] for e in errors] == ["a.>"]

        async def arrived() -> bool:
            await sender.publish("orders.eu.secret", b"secret")
            await sender.publish("orders.eu.new", b"new")
            return bool(narrow.events)

        await eventually(arrived, timeout=30, what="carol's import")
        await carol.flush(propagated=True)
        assert {subject for subject, _ in narrow.events} == {"a.orders.eu.new"}
        assert wide.events == []
    finally:
        await carol.close()
        await sender.close()


async def test_a_reload_applies_new_imports_to_live_subscriptions_and_revokes_removed_ones(
    tmp_path: Path,
) -> None:
    path = vpn_file(tmp_path, '[vpns.A]\nexports = [{ events = "orders.>" }]\n[vpns.B]\n')
    with MeshCluster(2, extra_args=("--mesh-vpns", str(path))) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        importer = await MeshClient(cluster["b"].route_url, vpn="B").connect()
        sender = await MeshClient(cluster["a"].route_url, vpn="A").connect()
        inbox = Inbox()
        try:
            importer.subscribe("a.>", inbox)
            await importer.flush(propagated=True)
            await sender.publish("orders.eu", b"before")
            await sender.flush(propagated=True)
            await importer.flush()
            assert inbox.events == []  # B imports nothing yet
            path.write_text(
                path.read_text() + 'imports = [{ vpn = "A", events = "orders.>", prefix = "a" }]\n'
            )
            await reload(cluster["a"])
            await reload(cluster["b"])

            async def arrived() -> bool:
                await sender.publish("orders.eu", b"after")
                return bool(inbox.events)

            await eventually(arrived, timeout=30, what="the new import")
            assert inbox.events[0] == ("a.orders.eu", b"after")
            path.write_text("[vpns.A]\n[vpns.B]\n")  # the import and the export withdrawn
            cluster["b"].kill(signal.SIGHUP)
            await eventually(partial(reloaded, cluster["b"], 2), what="b's second reload")
            await importer.flush()
            inbox.events.clear()
            await sender.publish("orders.eu", b"withdrawn")
            await sender.flush(propagated=True)
            await importer.flush()
            assert inbox.events == []
            await eventually(partial(knows_none_of_a, cluster["a"]), what="b's interest given up")
        finally:
            await importer.close()
            await sender.close()


async def knows_none_of_a(node: StreamsServerProcess) -> bool:
    """Whether ``node`` knows no interest of its peer b in VPN A's space."""
    known = (await status(node))["patterns"]["peers"]["b"]
    return not any(pattern.startswith("$vpn:A.") for pattern in known)


async def reload(node: StreamsServerProcess) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{node.url}/mesh/vpns/reload") as response:
        assert response.status == 200, await response.text()


async def reloaded(node: StreamsServerProcess, count: int) -> bool:
    return bool((await status(node))["vpns_reload"].get("reloaded", 0) >= count)


def test_vpn_check_names_every_sharing_mistake_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = vpn_file(
        tmp_path,
        "[vpns.A]\n"  # 1
        'exports = [{ events = "orders.>", to = ["B"] }]\n'  # 2
        "[vpns.B]\n"  # 3
        "imports = [\n"  # 4
        '  { vpn = "A", events = "orders.>", prefix = "a" },\n'  # 5
        '  { vpn = "A", events = "pay.>" },\n'  # 6: not exported
        '  { vpn = "A", events = "orders.eu", prefix = "a" },\n'  # 7: overlaps 5
        '  { vpn = "B", events = "x" },\n'  # 8: itself
        '  { vpn = "A", events = "orders.>", prefix = "*" },\n'  # 9: a wildcard prefix
        "]\n"
        'exports = [{ events = "a.>" }]\n'  # 11: passes on an import
        "[vpns.C]\n"
        'imports = [{ vpn = "A", events = "orders.>" }]\n',  # 13: exported to B only
    )
    assert main(["vpn", "check", str(path)]) == 2
    lines = [
        int(line.split(":")[1]) for line in capsys.readouterr().out.splitlines() if line.startswith(str(path))
    ]
    assert lines == [6, 7, 8, 9, 11, 11, 13]  # 11: it meets both imports under "a"


def service_file(tmp_path: Path) -> Path:
    users = "".join(
        f'[vpns.{vpn}.users.{user}]\npassword_hash = "{hash_password(CAROL)}"\n'
        for vpn, user in (("A", "resp"), ("B", "req"))
    )
    return vpn_file(
        tmp_path,
        '[vpns.A]\nexports = [{ service = "svc.>" }, { events = "news.>" }]\n'
        '[vpns.B]\nimports = [{ vpn = "A", service = "svc.>", prefix = "math" }]\n' + users,
    )


async def test_a_request_to_an_imported_service_is_answered_across_a_route(tmp_path: Path) -> None:
    """B imports A's service ``svc.>`` under ``math``: a NATS request of B's on ``math.svc.add`` (node
    b) reaches A's responder on ``svc.add`` (node a), whose reply comes back to B's requester; a
    request on a subject A does not export as a service has no responders; B's own subscriber to the
    import's subjects sees no request (it went to A only)."""
    extra_args = ("--mesh-vpns", str(service_file(tmp_path)), "--nats-port", "0")
    with MeshCluster(2, extra_args=extra_args) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        await request_and_answer(cluster["a"], cluster["b"])


@pytest.mark.timeout(150)
async def test_a_request_to_an_imported_service_is_answered_across_a_gateway(tmp_path: Path) -> None:
    extra_args = ("--mesh-vpns", str(service_file(tmp_path)), "--nats-port", "0")
    with running(TwoClusters(extra_args=extra_args)) as topo:
        await all_up(topo)
        await request_and_answer(topo["a2"], topo["b2"])


async def request_and_answer(responding: StreamsServerProcess, requesting: StreamsServerProcess) -> None:
    urls = [f"nats://127.0.0.1:{(await status(node))['nats']['port']}" for node in (responding, requesting)]
    responder = await nats.connect(
        urls[0], user="A/resp", password=CAROL, allow_reconnect=False, connect_timeout=30
    )
    requester = await nats.connect(
        urls[1], user="B/req", password=CAROL, allow_reconnect=False, connect_timeout=30
    )
    try:
        seen: list[str] = []

        async def add(msg: Msg) -> None:
            seen.append(msg.subject)
            await msg.respond(str(sum(int(n) for n in msg.data.split())).encode())

        await responder.subscribe("svc.add", cb=add)
        await responder.flush()
        b_side = await requester.subscribe("math.svc.>")

        async def answered() -> bool:
            try:
                reply = await requester.request("math.svc.add", b"2 3", timeout=2)
            except (NoRespondersError, nats.errors.TimeoutError):
                return False
            assert reply.data == b"5"
            return True

        await eventually(answered, timeout=60, what="the imported service's answer")
        assert set(seen) == {"svc.add"}  # in A's space, as A names it
        with pytest.raises(NoRespondersError):
            await requester.request("math.other", b"", timeout=5)
        before = (await status(requesting))["imports"]["by_import"][0]["no_responders"]  # warming up
        with pytest.raises(NoRespondersError):  # the import's, but nobody in A answers svc.nobody
            await requester.request("math.svc.nobody", b"", timeout=5)
        with pytest.raises(nats.errors.TimeoutError):
            await b_side.next_msg(timeout=0.5)
        imports = (await status(requesting))["imports"]
        assert imports["replies"] >= 1
        (row,) = imports["by_import"]
        assert (row["vpn"], row["from"], row["space"], row["kind"]) == ("B", "A", "math.svc.>", "service")
        assert row["requests"] >= 1
        assert row["no_responders"] == before + 1  # math.other is no import's: not counted
        metrics = await scrape(requesting)
        labels = '{from_vpn="A",space="math.svc.>",vpn="B"}'
        assert f"meshplane_mesh_vpn_import_no_responders_total{labels} {float(before + 1)}" in metrics
        assert f"meshplane_mesh_vpn_import_requests_total{labels} {float(row['requests'])}" in metrics
    finally:
        await requester.close()
        await responder.close()


@pytest.mark.timeout(170)  # its waits add up to 150 s
async def test_client_commands_take_vpn_and_the_vpn_is_kept(tmp_path: Path) -> None:
    """``meshplane sub/pub --transport mesh --mesh-node URL --vpn A``: the CLI's event reaches the CLI's
    subscriber in A, and a subscriber in B (which imports nothing) gets none of it."""
    path = vpn_file(tmp_path, "[vpns.A]\n[vpns.B]\n")
    with MeshCluster(1, extra_args=("--mesh-vpns", str(path))) as cluster:
        node = cluster.start()["a"]
        env = plane_env(tmp_path, "nats")  # the flags must win over the environment's transport
        mesh = ["--transport", "mesh", "--mesh-node", node.route_url, "--vpn", "A"]
        sub = await asyncio.to_thread(
            partial(
                subprocess.Popen,
                [*MESHPLANE, "sub", "ns/comp/ep", "kv", "--json", "--count", "1", "--timeout", "60", *mesh],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
        in_b = await MeshClient(node.route_url, vpn="B").connect()
        seen = Inbox()
        in_b.subscribe(">", seen)
        await in_b.flush()
        try:

            async def subscribed() -> bool:
                return any(p.startswith("$vpn:A.") for p in (await status(node))["patterns"]["local"])

            await eventually(subscribed, timeout=30, what="the CLI's subscription in VPN A")
            pub = await asyncio.to_thread(
                subprocess.run,
                [*MESHPLANE, "pub", "ns/comp/ep", "kv", '{"n": 1}', "--json", *mesh],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            assert pub.returncode == 0, pub.stderr
            out, err = await asyncio.to_thread(sub.communicate, timeout=60)
            assert sub.returncode == 0, err
            assert [json.loads(line)["payload"] for line in out.splitlines()] == [{"n": 1}]
            await in_b.flush()
            assert seen.events == []
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.communicate()
            await in_b.close()


async def test_one_clients_flood_of_requests_loses_no_other_clients_reply(tmp_path: Path) -> None:
    """B and C import A's service: a client of C and another client of B wait for their answers while
    one client of B sends 10,001 requests nobody answers (one connection holds 1,000 reply tokens, the
    node 10,000). Only the flooder's own oldest tokens go; both answers still come back."""
    users = "".join(
        f'[vpns.{vpn}.users.{user}]\npassword_hash = "{hash_password(CAROL)}"\n'
        for vpn, user in (("A", "resp"), ("B", "req"), ("C", "req"))
    )
    path = vpn_file(
        tmp_path,
        '[vpns.A]\nexports = [{ service = "svc.>" }]\n'
        '[vpns.B]\nimports = [{ vpn = "A", service = "svc.>" }]\n'
        '[vpns.C]\nimports = [{ vpn = "A", service = "svc.>" }]\n' + users,
    )
    with MeshCluster(1, extra_args=("--mesh-vpns", str(path), "--nats-port", "0")) as cluster:
        node = cluster.start()["a"]
        url = f"nats://127.0.0.1:{(await status(node))['nats']['port']}"
        clients = [
            await nats.connect(url, user=f"{vpn}/{user}", password=CAROL, connect_timeout=30)
            for vpn, user in (("A", "resp"), ("B", "req"), ("B", "req"), ("C", "req"))
        ]
        responder, flooder, *waiters = clients
        try:
            requests = await responder.subscribe("svc.>")
            await responder.flush()
            held, inboxes = [], []
            for n, waiter in enumerate(waiters):
                inboxes.append(await waiter.subscribe(f"_INBOX.w{n}"))
                await waiter.publish("svc.slow", b"%d" % n, reply=f"_INBOX.w{n}")
                await waiter.flush()
                held.append(await requests.next_msg(timeout=30))
            assert [m.data for m in held] == [b"0", b"1"]
            for i in range(10_001):
                await flooder.publish("svc.flood", b"%d" % i, reply="_INBOX.b")
            await flooder.flush()

            async def flood_dropped() -> bool:
                imports = (await status(node))["imports"]
                return int(imports.get("reply_tokens_dropped_requester", 0)) >= 9_001

            await eventually(flood_dropped, timeout=60, interval=0.2, what="the flooder's own tokens dropped")
            assert int((await status(node))["imports"].get("reply_tokens_dropped_full", 0)) == 0
            for n, (message, inbox) in enumerate(zip(held, inboxes, strict=True)):
                await message.respond(b"answer %d" % n)
                assert (await inbox.next_msg(timeout=30)).data == b"answer %d" % n
        finally:
            for client in clients:
                await client.close()


async def test_a_service_import_added_by_a_reload_takes_a_subject_the_direct_path_learnt(
    tmp_path: Path,
) -> None:
    """The default VPN already imports one of A's services; a reload adds a second, on a subject its
    NATS client had been publishing on (a route its node's direct path had learnt, into its own
    space): its PUBs go to A's responders from then on."""
    text = '[vpns.A]\nexports = [{ service = "svc.>" }, { service = "tools.>" }]\n[vpns.default]\n'
    path = vpn_file(tmp_path, text + 'imports = [{ vpn = "A", service = "svc.>" }]\n')
    with MeshCluster(1, extra_args=("--mesh-vpns", str(path), "--nats-port", "0")) as cluster:
        node = cluster.start()["a"]
        url = f"nats://127.0.0.1:{(await status(node))['nats']['port']}"
        responder = await MeshClient(node.route_url, vpn="A").connect()
        requester = await nats.connect(url, connect_timeout=30)
        tools = Inbox()
        try:
            responder.subscribe("tools.x", tools)
            await responder.flush()
            for _ in range(100):  # its own space: nobody there; a route the direct path learns
                await requester.publish("tools.x", b"before")
            await requester.flush()
            assert tools.events == []
            path.write_text(
                text + 'imports = [{ vpn = "A", service = "svc.>" }, { vpn = "A", service = "tools.>" }]\n'
            )
            await reload(node)

            async def arrived() -> bool:
                await requester.publish("tools.x", b"after")
                await requester.flush()
                await responder.flush()
                return bool(tools.events)

            await eventually(arrived, timeout=30, what="its PUB on the newly imported service at A")
            assert tools.events[0] == ("tools.x", b"after")
        finally:
            await requester.close()
            await responder.close()


async def test_an_mqtt_persistent_session_of_the_importer_gets_imported_qos1_events(tmp_path: Path) -> None:
    """B imports A's ``orders.>`` under ``a``; B's MQTT clients subscribe to ``a/orders/+`` at QoS 1.
    A QoS 1 message of A's reached B's clean-session client, but not the connected client with a
    persistent session: the door sends a session's QoS 1 messages from its queue only, and queues take
    no imports, so it was dropped (its publisher's PUBACK said stored). It is sent directly, as any
    QoS 1 message to a client without a session."""
    from meshplane.launchers.base import free_port
    from tests.support.mqtt import Paho, connected, subscribed

    vpns = vpn_file(
        tmp_path,
        '[vpns.A]\nexports = [{ events = "orders.>" }]\n'
        '[vpns.B]\nimports = [{ vpn = "A", events = "orders.>", prefix = "a" }]\n',
    )
    port = free_port()
    with MeshCluster(1, node_args={"a": ("--mesh-vpns", str(vpns), "--mqtt-port", str(port))}) as cluster:
        cluster.start()
        clients = []
        try:
            for client_id, clean in (("persistent", False), ("clean", True)):
                client = Paho(port, client_id, clean=clean)
                client.client.username_pw_set("x@B")
                clients.append(client)
                await subscribed(await connected(client), "a/orders/+", 1)
            publisher = Paho(port, "publisher")
            publisher.client.username_pw_set("y@A")
            clients.append(await connected(publisher))
            sent = publisher.client.publish("orders/eu", b"from A", qos=1)
            await asyncio.to_thread(sent.wait_for_publish, 10)
            for client in clients[:2]:
                await eventually(
                    lambda client=client: (
                        [(m[0], m[1], m[2]) for m in client.messages]  # type: ignore[misc]
                        == [("a/orders/eu", b"from A", 1)]
                    ),
                    timeout=10,
                    what=f"A's event at {client.client._client_id!r}",
                )
        finally:
            for client in clients:
                client.close()
