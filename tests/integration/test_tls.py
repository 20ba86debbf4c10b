"""TLS to NATS and to etcd (mutual TLS), against real servers run with certificates made for the test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from meshplane import DiscoveryError, EventPlane, Scope, TransportError
from meshplane.launchers import EtcdServer, NatsServer
from tests.conftest import make_config
from tests.helpers import one_event_through


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(folder / "server.key"))
    server.cert_chain_pems[0].write_to_path(str(folder / "server.pem"))
    client = ca.issue_cert("meshplane-client")
    client.private_key_pem.write_to_path(str(folder / "client.key"))
    client.cert_chain_pems[0].write_to_path(str(folder / "client.pem"))
    return folder


@pytest.fixture(scope="module")
def tls_nats(pki: Path) -> Iterator[NatsServer]:
    """nats-server with TLS that also requires client certificates signed by the CA."""
    with NatsServer(tls=(pki / "server.pem", pki / "server.key", pki / "ca.pem")) as server:
        yield server.start()


async def test_publish_and_subscribe_over_mutual_tls(tmp_path: Path, pki: Path, tls_nats: NatsServer) -> None:
    assert tls_nats.url.startswith("tls://")
    config = make_config(
        "nats",
        "file",
        tmp_path,
        tls_nats,
        None,
        nats_tls_ca=pki / "ca.pem",
        nats_tls_cert=pki / "client.pem",
        nats_tls_key=pki / "client.key",
    )
    scope = Scope.endpoint(f"tls-{uuid.uuid4().hex[:8]}", "worker", "generate")
    async with EventPlane(config) as plane:
        assert await one_event_through(plane, scope, b"over tls") == b"over tls"


@pytest.mark.parametrize(
    "missing", ["client certificate", "the CA"], ids=["no-client-certificate", "untrusted-server"]
)
async def test_tls_without_the_right_files_is_refused(
    tmp_path: Path, pki: Path, tls_nats: NatsServer, missing: str
) -> None:
    files = {"nats_tls_ca": pki / "ca.pem"} if missing == "client certificate" else {}
    config = make_config("nats", "file", tmp_path, tls_nats, None, connect_timeout=2.0, **files)
    scope = Scope.endpoint("tls-refused", "worker", "generate")
    with pytest.raises(TransportError, match="cannot connect to NATS"):
        async with EventPlane(config) as plane:
            await plane.publisher(scope, "t")


@pytest.fixture(scope="module")
def tls_etcd(pki: Path) -> Iterator[EtcdServer]:
    """etcd serving its clients over TLS and requiring client certificates signed by the CA."""
    with EtcdServer(tls=(pki / "server.pem", pki / "server.key", pki / "ca.pem")) as server:
        yield server.start()


async def test_etcd_discovery_over_mutual_tls(tmp_path: Path, pki: Path, tls_etcd: EtcdServer) -> None:
    assert tls_etcd.endpoint.startswith("https://")
    config = make_config(
        "zmq",
        "etcd",
        tmp_path,
        None,
        tls_etcd,
        etcd_tls_ca=pki / "ca.pem",
        etcd_tls_cert=pki / "client.pem",
        etcd_tls_key=pki / "client.key",
    )
    scope = Scope.endpoint(f"etcd-tls-{uuid.uuid4().hex[:8]}", "worker", "generate")
    async with EventPlane(config) as plane:  # the subscriber finds the publisher through etcd
        assert await one_event_through(plane, scope, b"found over tls") == b"found over tls"


async def test_etcd_without_a_client_certificate_is_refused(
    tmp_path: Path, pki: Path, tls_etcd: EtcdServer
) -> None:
    config = make_config(
        "zmq", "etcd", tmp_path, None, tls_etcd, connect_timeout=2.0, etcd_tls_ca=pki / "ca.pem"
    )
    with pytest.raises(DiscoveryError, match="cannot reach etcd"):
        async with EventPlane(config) as plane:
            await plane.publisher(Scope.endpoint("etcd-tls", "w", "g"), "t")
