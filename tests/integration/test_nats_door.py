"""The NATS door on real nodes (issue 59): nats-py, unchanged, against a 3-node mesh; MeshClients on
other nodes; hostile NATS clients."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import nats
import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from meshplane.core.doors.nats_protocol import NatsParser, Op
from meshplane.launchers import MeshCluster, StreamsServerProcess
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.mesh import Inbox, interest_reached, put_queue, queue_bodies, status


class NatsMesh:
    """A MeshCluster whose nodes each have a NATS door."""

    def __init__(
        self, count: int, extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> None:
        self.cluster = MeshCluster(count, extra_args=(*extra_args, "--nats-port", "0"), env=env)

    def port(self, node: str) -> int:
        return self.cluster[node].door_port("nats")

    def url(self, node: str) -> str:
        return f"nats://127.0.0.1:{self.port(node)}"

    def __getitem__(self, node: str) -> StreamsServerProcess:
        return self.cluster[node]

    def __enter__(self) -> NatsMesh:
        try:
            self.cluster.start().wait_linked()
        except BaseException:
            self.cluster.cleanup()  # stopped by PID, whatever had started
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.cleanup()


@pytest.fixture(scope="module")
def mesh() -> Iterator[NatsMesh]:
    with NatsMesh(3) as doors:
        yield doors


class Received:
    def __init__(self) -> None:
        self.msgs: list[Msg] = []

    async def cb(self, msg: Msg) -> None:
        self.msgs.append(msg)


async def test_nats_and_mesh_clients_reach_each_other_across_nodes(mesh: NatsMesh) -> None:
    on_b = Received()
    nc_b = await nats.connect(mesh.url("b"))
    nc_a = await nats.connect(mesh.url("a"))
    client_c = await MeshClient(mesh["c"].route_url).connect()
    inbox = Inbox()
    try:
        await nc_b.subscribe("orders.*.created", cb=on_b.cb)
        await nc_b.subscribe("orders.>", cb=on_b.cb)
        await nc_b.flush()
        client_c.subscribe("orders.>", inbox)
        await client_c.flush()
        for peer in ("b", "c"):
            await interest_reached(mesh["a"], peer, "orders.>")
        await nc_a.publish("orders.eu.created", b"\x00one\xff")  # from NATS on a: to b's NATS, c's mesh
        await nc_a.publish("orders.us", b"two", headers={"Trace": "t1"})
        await nc_a.flush()
        await eventually(lambda: len(on_b.msgs) >= 3 and len(inbox.events) >= 1, what="a's events at b, c")
        got = sorted((m.subject, m.data, m.sid) for m in on_b.msgs)
        assert [(s, d) for s, d, _ in got] == [
            ("orders.eu.created", b"\x00one\xff"),
            ("orders.eu.created", b"\x00one\xff"),
            ("orders.us", b"two"),
        ]
        assert next(m for m in on_b.msgs if m.subject == "orders.us").headers == {"Trace": "t1"}
        assert inbox.events[0] == ("orders.eu.created", b"\x00one\xff")  # the payload, byte for byte
        await interest_reached(mesh["c"], "b", "orders.>")
        on_b.msgs.clear()
        await client_c.publish("orders.eu.created", b"from-mesh")  # and the other way round
        await client_c.flush()
        await eventually(lambda: len(on_b.msgs) == 2, what="c's mesh event at b's NATS subscriptions")
        assert {m.data for m in on_b.msgs} == {b"from-mesh"}
    finally:
        await nc_a.close()
        await nc_b.close()
        await client_c.close()


async def test_unsub_max_ends_a_subscription_after_that_many(mesh: NatsMesh) -> None:
    nc_a = await nats.connect(mesh.url("a"))
    nc_c = await nats.connect(mesh.url("c"))
    received = Received()
    try:
        sub = await nc_c.subscribe("counted", cb=received.cb)
        await sub.unsubscribe(limit=3)
        await nc_c.flush()
        await interest_reached(mesh["a"], "c", "counted")
        for i in range(6):
            await nc_a.publish("counted", b"%d" % i)
        await nc_a.flush()
        await eventually(lambda: len(received.msgs) == 3, what="three events")
        await interest_reached(mesh["a"], "c", "counted", present=False)  # given up on the mesh too
        assert [m.data for m in received.msgs] == [b"0", b"1", b"2"]
    finally:
        await nc_a.close()
        await nc_c.close()


async def test_request_reply_across_nodes_and_no_responders(mesh: NatsMesh) -> None:
    responder = await nats.connect(mesh.url("c"))
    requester = await nats.connect(mesh.url("a"))

    async def answer(msg: Msg) -> None:
        await msg.respond(b"re: " + msg.data)

    try:
        await responder.subscribe("svc.echo", cb=answer)
        await responder.flush()
        await interest_reached(mesh["a"], "c", "svc.echo")
        reply = await requester.request("svc.echo", b"hello", timeout=10)
        assert reply.data == b"re: hello"
        with pytest.raises(NoRespondersError):  # nobody anywhere in the mesh: 503 at once
            await requester.request("svc.nobody", b"x", timeout=10)
        assert (await status(mesh["a"], patterns=False))["nats"]["counters"]["no_responders"] >= 1
        async with aiohttp.ClientSession() as http, http.get(f"{mesh['a'].url}/metrics") as response:
            metrics = await response.text()
        assert 'meshplane_mesh_nats_events_total{counter="no_responders"}' in metrics
        assert "meshplane_mesh_nats_clients 1.0" in metrics  # the requester
    finally:
        await responder.close()
        await requester.close()


async def test_a_publish_on_a_queue_bound_subject_is_stored_before_flush_returns(mesh: NatsMesh) -> None:
    await put_queue(mesh["c"], "nats-jobs", ["jobs.>"])
    await interest_reached(mesh["a"], "c", "$G.jobs.>")
    publisher = await nats.connect(mesh.url("a"))
    bodies = [b"job-%d" % i for i in range(200)]
    try:
        for body in bodies:
            await publisher.publish("jobs.build", body)
        await publisher.flush()  # its PONG waits until every one of them is stored
        assert (await status(mesh["a"], patterns=False))["nats"]["counters"]["guaranteed_stored"] >= 200
    finally:
        await publisher.close()

    async def stored() -> bool:
        return len(await queue_bodies(mesh["c"], "nats-jobs")) >= len(bodies)

    await eventually(stored, what="the queue on c holds them all")
    assert await queue_bodies(mesh["c"], "nats-jobs") == bodies  # once each, in order


async def test_a_queue_group_spread_over_three_nodes_gets_each_event_once(mesh: NatsMesh) -> None:
    members = {node: await nats.connect(mesh.url(node)) for node in ("a", "b", "c")}
    members["b2"] = await nats.connect(mesh.url("b"))  # two members on b
    plain = {node: await nats.connect(mesh.url(node)) for node in ("a", "b", "c")}
    publisher = await nats.connect(mesh.url("a"))
    received = {name: Received() for name in members}
    barriers = {node: Received() for node in plain}
    try:
        for name, nc in members.items():
            await nc.subscribe("work.*", queue="workers", cb=received[name].cb)
            await nc.flush()
        for node, nc in plain.items():  # not in the group: the barrier that says a node has had them all
            await nc.subscribe("work.end", cb=barriers[node].cb)
            await nc.flush()
        for node, peers in (("a", ("b", "c")), ("b", ("a", "c")), ("c", ("a", "b"))):
            for peer in peers:
                await interest_reached(mesh[node], peer, "$NQ.workers.work.*")
        count = 300
        for i in range(count):
            await publisher.publish("work.item", b"%d" % i)
        await publisher.publish("work.end", b"")  # after them on every link (a link keeps the order)
        await publisher.flush()
        await eventually(lambda: all(len(b.msgs) == 1 for b in barriers.values()), what="the barrier")
        for nc in members.values():
            await nc.flush()  # what each node sent its members before is in
        items = [m for name in members for m in received[name].msgs if m.subject == "work.item"]
        assert sorted(int(m.data) for m in items) == list(range(count))  # each event once, mesh-wide
        assert all(received[name].msgs for name in members)  # spread over every node and member
        assert sum(len(r.msgs) for r in received.values()) == count + 1  # work.end too, once
    finally:
        for nc in (*members.values(), *plain.values(), publisher):
            await nc.close()


# --- raw clients: the protocol's errors ----------------------------------------------------------------


class Raw:
    """A NATS client written by hand, reading what the door sends with the door's own parser."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = NatsParser(max_payload=64 * 1024 * 1024)
        self.ops: list[Op] = []

    @classmethod
    async def open(cls, url: str) -> Raw:
        host, port = url.removeprefix("nats://").split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until(self, what: type, timeout: float = 10.0) -> Op:
        """The next op of type ``what`` (those before it kept in ``ops``); AssertionError at EOF."""
        async with asyncio.timeout(timeout):
            while True:
                for index, op in enumerate(self.ops):
                    if isinstance(op, what):
                        return self.ops.pop(index)
                data = await self.reader.read(65536)
                if not data:
                    raise AssertionError(f"closed before {what.__name__}; got {self.ops}")
                self.ops += self.parser.feed(data)

    async def closed(self, timeout: float = 10.0) -> bool:
        async with asyncio.timeout(timeout):
            while await self.reader.read(65536):
                pass
        return True

    def close(self) -> None:
        self.writer.close()


async def test_verbose_and_pedantic_answer_each_operation(mesh: NatsMesh) -> None:
    from meshplane.core.doors.nats_protocol import Err, Info, Ok, Pong

    raw = await Raw.open(mesh.url("b"))
    try:
        info = await raw.until(Info)
        assert isinstance(info, Info)
        assert info.options["max_payload"] == 8 * 1024 * 1024
        await raw.send(b'CONNECT {"verbose":true,"pedantic":true}\r\n')
        await raw.until(Ok)
        await raw.send(b"SUB a.b 1\r\n")
        await raw.until(Ok)
        await raw.send(b"PUB a.*.c 2\r\nhi\r\n")  # a wildcard in a subject: pedantic says so
        err = await raw.until(Err)
        assert err == Err("Invalid Publish Subject")
        await raw.send(b"SUB a..b 2\r\n")
        assert await raw.until(Err) == Err("Invalid Subject")
        await raw.send(b"PUB $JS.API.INFO 0\r\n\r\n")
        err = await raw.until(Err)
        assert isinstance(err, Err)
        assert "meshplane's streams" in err.message
        await raw.send(b"PING\r\n")
        await raw.until(Pong)  # the connection stays after those errors
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("attack", "error"),
    [
        (b"CONNECT {}\r\nSUB " + b"x" * 5000, "Maximum Control Line Exceeded"),
        (b"CONNECT {}\r\nPUB big 9000000\r\n", "Maximum Payload Violation"),
        (b"CONNECT {}\r\n\x16\x03\x01\x02\x00garbage\r\n", "Unknown Protocol Operation"),
        (b"PUB early 1\r\nx\r\n", "Authorization Violation"),
    ],
)
async def test_hostile_clients_get_the_error_and_are_closed_others_keep_going(
    mesh: NatsMesh, attack: bytes, error: str
) -> None:
    from meshplane.core.doors.nats_protocol import Err

    bystander = await nats.connect(mesh.url("a"))
    raw = await Raw.open(mesh.url("a"))
    try:
        await raw.send(attack)
        assert await raw.until(Err) == Err(error)
        assert await raw.closed()
        reply_seen = Received()
        await bystander.subscribe("still.here", cb=reply_seen.cb)
        await bystander.publish("still.here", b"ok")
        await bystander.flush()
        await eventually(lambda: len(reply_seen.msgs) == 1, what="the bystander served")
    finally:
        raw.close()
        await bystander.close()


async def test_a_client_that_never_connects_is_closed_at_the_auth_timeout(mesh: NatsMesh) -> None:
    from meshplane.core.doors.nats_protocol import Err

    raw = await Raw.open(mesh.url("c"))
    try:
        await raw.send(b"CONN")  # slowloris: a CONNECT that never ends
        assert await raw.until(Err, timeout=20) == Err("Authentication Timeout")
        assert await raw.closed()
    finally:
        raw.close()


async def test_a_slow_consumer_is_cut_with_the_reason(mesh: NatsMesh) -> None:
    sock = socket.create_connection(("127.0.0.1", mesh.port("b")))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"CONNECT {}\r\nSUB flood 1\r\nPING\r\n")
    publisher = await nats.connect(mesh.url("b"))
    try:
        body = b"x" * 60_000

        async def cut() -> bool:
            return bool((await status(mesh["b"], patterns=False))["nats"]["counters"].get("slow_consumers"))

        for i in range(3000):  # ~180 MB at a reader that reads nothing: past the 96 MB bound
            await publisher.publish("flood", body)
            # Asked every 50 publishes (3 MB), not after each: ~1,600 GET /mesh took most of its time.
            if i % 50 == 49 and await cut():
                break
        await publisher.flush()
        await eventually(cut, timeout=30, what="the slow consumer cut")
        assert publisher.is_connected  # the publisher is not held back
    finally:
        sock.close()
        await publisher.close()


# --- credentials -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vpn_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsMesh]:
    from meshplane.mesh.vpns import hash_password

    folder: Path = tmp_path_factory.mktemp("vpns")
    vpns = folder / "vpns.toml"
    vpns.write_text(
        "[vpns.A.users.alice]\n"
        f'password_hash = "{hash_password("alice-pw")}"\n'
        'publish = { allow = ["orders.>", "_INBOX.>"] }\n'
        "[vpns.B.users.bob]\n"
        f'password_hash = "{hash_password("bob-pw")}"\n'
    )
    with NatsMesh(2, extra_args=("--mesh-vpns", str(vpns))) as doors:
        yield doors


async def test_vpn_users_log_in_and_stay_in_their_vpn(vpn_mesh: NatsMesh) -> None:
    alice_a = await nats.connect(vpn_mesh.url("a"), user="alice", password="alice-pw")
    alice_b = await nats.connect(vpn_mesh.url("b"), user="A/alice", password="alice-pw")
    bob_b = await nats.connect(vpn_mesh.url("b"), user="bob", password="bob-pw")
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    alice_errors = await nats.connect(vpn_mesh.url("a"), user="alice", password="alice-pw", error_cb=on_error)
    seen_alice, seen_bob = Received(), Received()
    try:
        await alice_b.subscribe("orders.>", cb=seen_alice.cb)
        await bob_b.subscribe("orders.>", cb=seen_bob.cb)
        await alice_b.flush()
        await bob_b.flush()
        await interest_reached(vpn_mesh["a"], "b", "$vpn:A.orders.>")
        await alice_a.publish("orders.1", b"for A")
        await alice_a.flush()
        await eventually(lambda: len(seen_alice.msgs) == 1, what="A's event in A")
        assert seen_alice.msgs[0].subject == "orders.1"  # the VPN's prefix is off
        await alice_errors.publish("payroll", b"no")  # not in alice's publish permissions
        await alice_errors.flush()
        await eventually(lambda: bool(errors), what="the permissions violation")
        assert "permissions violation for publish" in str(errors[0]).lower()
        bob_a = await nats.connect(vpn_mesh.url("a"), user="bob", password="bob-pw")
        await interest_reached(vpn_mesh["a"], "b", "$vpn:B.orders.>")
        await bob_a.publish("orders.1", b"for B")  # after A's, on the same link
        await bob_a.flush()
        await eventually(lambda: len(seen_bob.msgs) == 1, what="B's event in B")
        assert [m.data for m in seen_bob.msgs] == [b"for B"]  # A's never crossed to B
        assert [m.data for m in seen_alice.msgs] == [b"for A"]
        await bob_a.close()
    finally:
        for nc in (alice_a, alice_b, bob_b, alice_errors):
            await nc.close()


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "alice-pw"), ("", "")])
async def test_wrong_credentials_are_refused(vpn_mesh: NatsMesh, user: str, password: str) -> None:
    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        await nats.connect(
            vpn_mesh.url("a"), user=user or None, password=password or None, allow_reconnect=False
        )
    refused = (await status(vpn_mesh["a"], patterns=False))["nats"]["counters"]["auth_refused"]
    assert refused >= 1


# --- across gateways -------------------------------------------------------------------------------------


async def test_request_reply_and_events_cross_a_gateway() -> None:
    from tests.integration.test_mesh_gateways_guaranteed import TwoClusters, all_up, running

    with running(TwoClusters(extra_args=("--nats-port", "0"))) as topo:  # 0: each door on a free port
        await all_up(topo)
        port = {name: (await status(topo[name], patterns=False))["nats"]["port"] for name in ("a2", "b2")}
        responder = await nats.connect(f"nats://127.0.0.1:{port['b2']}")  # cluster B, behind b1's gateway
        requester = await nats.connect(f"nats://127.0.0.1:{port['a2']}")  # cluster A, behind a1's
        seen = Received()

        async def answer(msg: Msg) -> None:
            await msg.respond(b"from B: " + msg.data)

        try:
            await responder.subscribe("svc.far", cb=answer)
            await responder.subscribe("news.>", cb=seen.cb)
            await responder.flush()
            replies: list[bytes] = []

            async def answered() -> bool:  # until B's interest has crossed to A: no responders before
                try:
                    replies.append((await requester.request("svc.far", b"ping", timeout=5)).data)
                except NoRespondersError:
                    return False
                return True

            await eventually(answered, timeout=30, interval=0.1, what="a reply across the gateways")
            assert replies == [b"from B: ping"]
            await requester.publish("news.today", b"crossed", headers={"K": "v"})
            await requester.flush()
            await eventually(lambda: len(seen.msgs) == 1, what="A's event at B's NATS subscriber")
            assert (seen.msgs[0].subject, seen.msgs[0].data, seen.msgs[0].headers) == (
                "news.today",
                b"crossed",
                {"K": "v"},
            )
        finally:
            await responder.close()
            await requester.close()


# --- TLS -------------------------------------------------------------------------------------------------


async def test_the_door_speaks_the_nodes_tls_and_refuses_clients_without_a_certificate(
    tmp_path: Path,
) -> None:
    from tests.mesh_pki import MeshCA

    ca = MeshCA(tmp_path)
    ca.issue("a", "meshplane://node/c1/a", "127.0.0.1")
    ca.issue("app", "meshplane://client/app")
    tls_args = ("--mesh-tls-cert", str(tmp_path / "a.pem"), "--mesh-tls-key", str(tmp_path / "a.key"))
    with NatsMesh(1, extra_args=(*tls_args, "--mesh-tls-ca", str(tmp_path / "ca.pem"))) as doors:
        with_cert = ssl.create_default_context(cafile=tmp_path / "ca.pem")
        with_cert.load_cert_chain(tmp_path / "app.pem", tmp_path / "app.key")
        nc = await nats.connect(f"tls://127.0.0.1:{doors.port('a')}", tls=with_cert)
        got = Received()
        try:
            await nc.subscribe("sealed", cb=got.cb)
            await nc.publish("sealed", b"over TLS")
            await nc.flush()
            await eventually(lambda: len(got.msgs) == 1, what="an event over TLS")
            assert got.msgs[0].data == b"over TLS"
        finally:
            await nc.close()
        without_cert = ssl.create_default_context(cafile=tmp_path / "ca.pem")
        assert await refused(f"tls://127.0.0.1:{doors.port('a')}", without_cert)

        async def counted() -> bool:
            return bool(
                (await status(doors["a"], patterns=False))["nats"]["counters"].get("tls_handshake_failed")
            )

        await eventually(counted, what="the refused handshake counted")


async def refused(url: str, tls: ssl.SSLContext) -> bool:
    """Whether a client with ``tls`` cannot get a PONG from the door (nats-py either raises at
    connect or, when the server's refusal comes after its side of the handshake, at flush)."""
    try:
        nc = await nats.connect(url, tls=tls, allow_reconnect=False, connect_timeout=5)
    except Exception:
        return True
    try:
        await nc.flush(5)
    except Exception:
        return True
    finally:
        await nc.close()
    return False
