"""Client certificates mapped to Message VPN users (issue 58) on a real node with mutual TLS: a client
whose verified certificate names a user of its VPN (``certificate = "CN=alice"``, or a SAN:
``DNS=...``, ``URI=...``) is logged in as that user without a password, and held to its permissions;
one whose certificate names nobody is refused with the reason, counted; a password still logs in
whoever has one. Real certificates from a CA made in the test."""

from __future__ import annotations

import re
import ssl
import traceback
from pathlib import Path

import pytest

from meshplane.errors import PermissionDenied, TransportAuthError
from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.mesh_pki import MeshCA
from tests.support.mesh import Inbox, status

CAROL = "carol-pw-41b7"
DAVE_CAROL = (  # users of VPN A: dave by a SAN of his certificate, carol by password
    '[vpns.A.users.dave]\ncertificate = "DNS=dave.clients.example"\n'
    f'[vpns.A.users.carol]\npassword_hash = "{hash_password(CAROL)}"\n'
)


def client_context(pki: Path, name: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_cert_chain(pki / f"{name}.pem", pki / f"{name}.key")
    context.load_verify_locations(pki / "ca.pem")
    return context


def node_args(tmp_path: Path, ca: MeshCA, vpns: str) -> dict[str, tuple[str, ...]]:
    """Node a's arguments: its certificate from ``ca``, mutual TLS, and the VPN file ``vpns``."""
    ca.issue("a", "meshplane://node/c1/a", "a", "127.0.0.1")
    (tmp_path / "vpns.toml").write_text(vpns)
    tls = (
        *("--mesh-tls-cert", str(tmp_path / "a.pem"), "--mesh-tls-key", str(tmp_path / "a.key")),
        *("--mesh-tls-ca", str(tmp_path / "ca.pem")),
    )
    return {"a": (*tls, "--mesh-vpns", str(tmp_path / "vpns.toml"))}


async def test_a_client_certificate_logs_in_as_the_user_it_names_and_one_naming_nobody_is_refused(
    tmp_path: Path,
) -> None:
    ca = MeshCA(tmp_path)
    ca.issue("alice", "meshplane://client/alice", common_name="alice")
    ca.issue("dave", "meshplane://client/d", "dave.clients.example", common_name="someone")
    ca.issue("mallory", "meshplane://client/mallory", common_name="mallory")
    vpns = '[vpns.A.users.alice]\ncertificate = "CN=alice"\npublish = { deny = ["secret.>"] }\n' + DAVE_CAROL
    with MeshCluster(1, node_args=node_args(tmp_path, ca, vpns)) as cluster:
        node = cluster.start()["a"]
        alice = await MeshClient(node.route_url, vpn="A", tls=client_context(tmp_path, "alice")).connect()
        dave = await MeshClient(node.route_url, vpn="A", tls=client_context(tmp_path, "dave")).connect()
        told: list[PermissionDenied] = []
        mallory = MeshClient(
            node.route_url, vpn="A", tls=client_context(tmp_path, "mallory"), on_error=told.append
        )
        carol = MeshClient(
            node.route_url, vpn="A", user="carol", password=CAROL, tls=client_context(tmp_path, "mallory")
        )
        seen = Inbox()
        try:
            dave.subscribe(">", seen)
            await dave.flush(propagated=True)
            await alice.publish("secret.x", b"denied")  # alice's permissions: she is alice
            with pytest.raises(
                PermissionDenied, match=re.escape("publish to 'secret.x' denied by 'secret.>'")
            ):
                await alice.flush()
            await alice.publish("orders.x", b"allowed")
            await alice.flush(propagated=True)
            await eventually(lambda: [body for _, body in seen.events] == [b"allowed"], what="alice's event")

            await mallory.connect()  # the handshake passes; the node refuses it without a user
            with pytest.raises(TransportAuthError, match="names none of them"):
                await mallory.flush()  # waiting as the refusal comes: it is told why, not "lost"
            await eventually(lambda: bool(told), timeout=10, what="mallory told why")
            assert "the client's certificate names none of them" in str(told[0])
            await eventually(lambda: not mallory.connected, timeout=10, what="mallory closed")
            # Dialling again would be refused again at once: it stops, and the application is told.
            with pytest.raises(TransportAuthError, match="names none of them"):
                await mallory.flush()
            # Asked again and again, it says so again: the error's traceback does not grow with each
            # ask (the frames it would keep hold their locals: an application retrying leaked them).
            depths = []
            for _ in range(3):
                with pytest.raises(TransportAuthError, match="names none of them") as raised:
                    await mallory.flush()
                depths.append(len(traceback.extract_tb(raised.value.__traceback__)))
            assert depths[0] == depths[-1], f"traceback frames, ask after ask: {depths}"
            assert not mallory.connected
            await mallory.close()
            await carol.connect()  # a password logs in whoever has one, whatever its certificate
            await carol.flush()

            async def logged_in() -> list[str]:
                return sorted(c["user"] for c in (await status(node))["clients"] if c.get("vpn") == "A")

            async def only_users() -> bool:
                return await logged_in() == ["alice", "carol", "dave"]

            await eventually(only_users, timeout=10, what="alice, carol and dave in")
            answer = await status(node)
            assert answer["vpns"]["A"]["clients"] == 3
            assert answer["vpns"]["A"]["violations"] == {"alice": 1}
            assert answer["vpns"]["A"]["logins_refused"] >= 1
        finally:
            for client in (alice, dave, mallory, carol):
                await client.close()


async def test_a_certificate_naming_two_users_logs_in_as_neither(tmp_path: Path) -> None:
    """A certificate whose CN names one user and whose SAN names another proves neither: the node
    must not pick one by the file's order of users (``alice`` first: a certificate made for dave,
    whose CN happened to be ``alice``, became alice). It is refused with the reason; a password
    still logs in."""
    ca = MeshCA(tmp_path)
    ca.issue("both", "meshplane://client/both", "dave.clients.example", common_name="alice")
    vpns = '[vpns.A.users.alice]\ncertificate = "CN=alice"\n' + DAVE_CAROL
    with MeshCluster(1, node_args=node_args(tmp_path, ca, vpns)) as cluster:
        node = cluster.start()["a"]
        told: list[PermissionDenied] = []
        both = MeshClient(node.route_url, vpn="A", tls=client_context(tmp_path, "both"), on_error=told.append)
        carol = MeshClient(
            node.route_url, vpn="A", user="carol", password=CAROL, tls=client_context(tmp_path, "both")
        )
        try:
            await both.connect()
            await eventually(lambda: bool(told), timeout=10, what="told why")
            assert "names more than one of them: alice, dave" in str(told[0])
            await eventually(lambda: not both.connected, timeout=10, what="closed")
            await carol.connect()
            await carol.flush()
            users = [c["user"] for c in (await status(node))["clients"] if c.get("vpn") == "A"]
            assert users == ["carol"]
        finally:
            await both.close()
            await carol.close()


async def test_a_certificate_client_refused_by_a_limit_reconnects_once_there_is_room(tmp_path: Path) -> None:
    """A limit is not a wrong login: a certificate's client refused because its user's connections
    are full (its own earlier session, still counted) must keep dialling, with backoff, and get in
    once there is room. It stopped for ever, as if its certificate named nobody."""
    ca = MeshCA(tmp_path)
    ca.issue("alice", "meshplane://client/alice", common_name="alice")
    vpns = '[vpns.A.users.alice]\ncertificate = "CN=alice"\nmax_connections = 1\n'
    with MeshCluster(1, node_args=node_args(tmp_path, ca, vpns)) as cluster:
        node = cluster.start()["a"]
        first = await MeshClient(node.route_url, vpn="A", tls=client_context(tmp_path, "alice")).connect()
        told: list[PermissionDenied] = []
        second = MeshClient(
            node.route_url, vpn="A", tls=client_context(tmp_path, "alice"), on_error=told.append
        )
        try:
            await second.connect()
            await eventually(lambda: not second.connected, timeout=10, what="the second refused")

            async def refused() -> bool:
                return bool((await status(node))["vpns"]["A"]["limits_refused"].get("user_connections", 0))

            await eventually(refused, timeout=10, what="the limit's refusal counted")
            await first.close()
            await eventually(lambda: second.connected, timeout=20, what="the second in, once there is room")
            assert "1 clients on this node (its limit)" in str(told[0])  # it was told why, meanwhile

            async def alice_in() -> bool:
                return [c["user"] for c in (await status(node))["clients"]] == ["alice"]

            await eventually(alice_in, timeout=10, what="alice logged in")
        finally:
            await first.close()
            await second.close()
