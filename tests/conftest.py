"""Real servers for the integration tests: nats-server and etcd on free loopback ports, stopped by PID."""

from __future__ import annotations

import atexit
import compileall
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

import meshplane
from meshplane import PlaneConfig
from meshplane.launchers import BrokerProcess, EtcdServer, NatsServer, StreamsServerProcess
from tests.support import server_logs

# The developer's connection contexts (`meshplane up`, `meshplane context select`) must not reach the
# tests, nor the tests' `up` runs the developer's: every test process reads its own, empty, config folder.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="meshplane-test-config-")
# Nor their state folder: every mesh node registers there (file discovery's default) for the mesh view.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="meshplane-test-state-")
for _folder in (os.environ["XDG_CONFIG_HOME"], os.environ["XDG_STATE_HOME"]):  # removed on exit
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)
os.environ.pop("MESHPLANE_CONTEXT", None)
server_logs.install()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile meshplane's sources (and the suite's, which the chaos harness runs as modules) once.
    An editable install leaves that to the first import, and with PYTHONDONTWRITEBYTECODE no import
    writes it: every server, broker and CLI command the suite starts (hundreds) compiled ~150 modules
    again (test_cli_config and test_cli_errors took 25% more CPU). Only what changed is compiled again;
    by pytest-xdist's controller, not by each of its workers."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    for package in (Path(meshplane.__file__).parent, Path(__file__).parent):
        compileall.compile_dir(package, quiet=2, workers=1)


# CI replays the same examples every run (deterministic); a developer's runs keep exploring.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

TRANSPORTS = ["nats", "zmq"]
DISCOVERY_BACKENDS = ["mem", "file", "etcd"]
# Broker mode finds no publishers in discovery, so one backend each is enough: brokers named in
# DYN_ZMQ_BROKER_URL, and brokers registered in etcd (DYN_ZMQ_BROKER_ENABLED).
BROKER_MODES = [("zmq-broker", "file"), ("zmq-broker-discovery", "etcd")]
# ZeroMQ with CURVE on: direct (publisher keys from discovery records) and through CURVE brokers.
CURVE_MODES = [("zmq-curve", "file"), ("zmq-curve-broker", "file")]
# Through a mesh node (a `meshplane serve --node-id` process): publishers and subscribers are its clients.
MESH_MODES = [("mesh", "file"), ("mesh", "etcd")]
HEADER8_MODES = [("nats-header8", "file"), ("zmq-header8", "file")]  # the 8-byte-header layout
# Without the C extension, as where it is not built (MESHPLANE_NO_EXTENSIONS): pyzmq and Python decoders
NO_EXTENSION_MODES = [("zmq-noext", "file"), ("zmq-header8-noext", "file"), ("nats-noext", "file")]
# A ZeroMQ subscriber that spins after each batch instead of sleeping (MESHPLANE_BUSY_POLL)
BUSY_POLL_MODES = [("zmq-busypoll", "file")]


@dataclass(frozen=True)
class CurveKeys:
    """Key pairs made with zmq.auth: one for the test's publishers and subscribers, one for brokers,
    one that nobody allows; ``allowed`` holds the trusted public keys (plane's and broker's)."""

    folder: Path

    def secret(self, name: str) -> Path:
        return self.folder / f"{name}.key_secret"

    def public(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    @property
    def allowed(self) -> Path:
        return self.folder / "allowed"

    def public_key(self, name: str) -> bytes:
        import zmq.auth

        return zmq.auth.load_certificate(self.public(name))[0]

    def broker_env(self) -> dict[str, str]:
        """A broker process's environment: the broker key pair, clients allowed by the plane's key."""
        return {
            **os.environ,
            "MESHPLANE_ZMQ_CURVE_CERT": str(self.secret("broker")),
            "MESHPLANE_ZMQ_CURVE_ALLOWED": str(self.allowed),
        }


@pytest.fixture
def shm_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder on tmpfs for the fault-injection loops, whose subject is what the code does after
    each file operation fails, not the disk: they run their workload once per operation, and on a
    shared disk each fsync costs milliseconds (a loop took 13-22 s there, 1.8-2.0 s on tmpfs).
    ``tmp_path`` where there is no /dev/shm."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="meshplane-faults-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def curve_keys(tmp_path_factory: pytest.TempPathFactory) -> CurveKeys:
    import zmq.auth

    keys = CurveKeys(tmp_path_factory.mktemp("curve"))
    keys.allowed.mkdir()
    for name in ("plane", "broker", "intruder"):
        public, _ = zmq.auth.create_certificates(keys.folder, name)
        if name != "intruder":
            shutil.copy(public, keys.allowed)
    return keys


@pytest.fixture(scope="session")
def curve_brokers(curve_keys: CurveKeys) -> Iterator[list[BrokerProcess]]:
    """Two brokers with CURVE."""
    with running_brokers(("--no-register",), ("--no-register",), env=curve_keys.broker_env()) as brokers:
        yield brokers


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        server.start()
        yield server


@pytest.fixture(scope="session")
def mesh_node() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess(extra_args=("--node-id", "contract", "--route-port", "0")) as node:
        yield node.start()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        server.start()
        yield server


@contextlib.contextmanager
def running_brokers(
    *args_per_broker: tuple[str, ...], env: dict[str, str] | None = None
) -> Iterator[list[BrokerProcess]]:
    """One broker process per argument tuple, on free loopback ports, stopped by PID afterwards."""
    brokers = [BrokerProcess(extra_args=args, env=env) for args in args_per_broker]
    try:
        for broker in brokers:  # booting at once: two take about the time of one
            broker.start(ready=False)
        for broker in brokers:
            broker.wait_ready()
        yield brokers
    finally:
        for broker in brokers:
            broker.cleanup()


@pytest.fixture(scope="session")
def session_brokers(etcd_server: EtcdServer) -> Iterator[list[BrokerProcess]]:
    """Two brokers for the contract suite, registered in the session's etcd: one of each relay."""
    registered = ("--discovery", "etcd", "--etcd-endpoints", etcd_server.endpoint)
    with running_brokers((*registered, "--relay", "python"), registered) as brokers:
        yield brokers


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
    params=[(t, d) for t in TRANSPORTS for d in DISCOVERY_BACKENDS]
    + BROKER_MODES
    + CURVE_MODES
    + MESH_MODES
    + HEADER8_MODES
    + NO_EXTENSION_MODES
    + BUSY_POLL_MODES
    + [("mem", "mem")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def plane_config(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> PlaneConfig:
    """Every transport x discovery combination, both broker modes, CURVE, a mesh node, the 8-byte-
    header layout, both transports without the C extension and a busy-polling ZeroMQ subscriber, on real
    servers; and the in-process transport (an extra, for the application API's test plane)."""
    transport, discovery = request.param
    if transport.endswith("-noext"):
        monkeypatch.setenv("MESHPLANE_NO_EXTENSIONS", "1")
        transport = transport.removesuffix("-noext")
    if transport == "zmq-busypoll":
        return make_config("zmq", discovery, tmp_path, None, None, busy_poll=0.05)
    if transport.endswith("-header8"):
        transport = transport.removesuffix("-header8")
        nats = request.getfixturevalue("nats_server") if transport == "nats" else None
        return make_config(transport, discovery, tmp_path, nats, None, wire_format="header8")
    nats = request.getfixturevalue("nats_server") if transport == "nats" else None
    etcd = request.getfixturevalue("etcd_server") if discovery == "etcd" else None
    if transport.startswith("zmq-curve"):
        keys: CurveKeys = request.getfixturevalue("curve_keys")
        curve: dict[str, object] = {
            "zmq_curve_cert": keys.secret("plane"),
            "zmq_curve_allowed": keys.allowed,
        }
        if transport == "zmq-curve-broker":
            brokers_: list[BrokerProcess] = request.getfixturevalue("curve_brokers")
            curve["zmq_brokers"] = tuple(b.address for b in brokers_)
            curve["zmq_curve_broker_key"] = str(keys.public("broker"))
        return make_config("zmq", discovery, tmp_path, None, etcd, **curve)
    if transport.startswith("zmq-broker"):
        brokers: list[BrokerProcess] = request.getfixturevalue("session_brokers")
        if transport == "zmq-broker":
            return make_config(
                "zmq", discovery, tmp_path, None, etcd, zmq_brokers=tuple(b.address for b in brokers)
            )
        return make_config("zmq", discovery, tmp_path, None, etcd, zmq_broker_enabled=True)
    if transport == "mesh":
        node: StreamsServerProcess = request.getfixturevalue("mesh_node")
        return make_config("mesh", discovery, tmp_path, None, etcd, mesh_node=node.route_url)
    return make_config(transport, discovery, tmp_path, nats, etcd)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Spark tests first. PySpark starts its JVM with a Python ``preexec_fn``: Python runs in a
    forked child of this process, which is only safe while the process has no other threads. Later it
    has gRPC's (etcd), libzmq's and asyncio's, and the child crashed now and then (SIGSEGV)."""
    items.sort(key=lambda item: 0 if item.path.name.startswith("test_spark") else 1)
    for item in items:  # one given the Spark session starts a JVM: `make check` leaves it out
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark_jvm)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report (or its failed setup's: a cluster that never formed) ends with its
    servers' logs (``tests/support/server_logs.py``)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and call.when in ("setup", "call"):
        report.sections.append(("servers' logs", server_logs.tails()))
    if call.when == "setup":
        server_logs.begin_test()
