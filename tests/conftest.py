"""Real servers for the integration tests: nats-server and etcd on free loopback ports, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane import PlaneConfig
from meshplane.servers import EtcdServer, NatsServer

TRANSPORTS = ["nats", "zmq"]
DISCOVERY_BACKENDS = ["mem", "file", "etcd"]


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        server.start()
        yield server


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        server.start()
        yield server


def make_config(
    transport: str,
    discovery: str,
    tmp_path: Path,
    nats: NatsServer | None,
    etcd: EtcdServer | None,
    **kw: object,
) -> PlaneConfig:
    return PlaneConfig.from_env(
        {},
        event_plane=transport,
        discovery_backend=discovery,
        nats_server=nats.url if nats else None,
        file_kv=tmp_path / "kv",
        file_kv_poll_interval=0.02,
        etcd_endpoints=(etcd.endpoint,) if etcd else None,
        **kw,
    )


@pytest.fixture(
    params=[(t, d) for t in TRANSPORTS for d in DISCOVERY_BACKENDS], ids=lambda p: f"{p[0]}-{p[1]}"
)
def plane_config(request: pytest.FixtureRequest, tmp_path: Path) -> PlaneConfig:
    """Every transport x discovery combination, on real servers."""
    transport, discovery = request.param
    nats = request.getfixturevalue("nats_server") if transport == "nats" else None
    etcd = request.getfixturevalue("etcd_server") if discovery == "etcd" else None
    return make_config(transport, discovery, tmp_path, nats, etcd)
