"""meshplane against the real Dynamo runtime (ai-dynamo-runtime 1.6.1), both directions, on real servers.

The runtime runs in its own process (``tests/dynamo_peer.py`` under ``.venv-dynamo``'s Python, which
``make test`` installs; without it these tests fail, they never skip). Its one Python pair that carries an
event per call is the forward-pass metrics publisher and subscriber, so the events here are its
forward-pass-metrics snapshots: each test checks their content, not just a count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from meshplane import EventEnvelope, EventPlane, EventSubscriber, PlaneConfig, Scope
from meshplane.core.names import EVENT_CHANNELS_BUCKET
from meshplane.core.records import file_name_to_key, key_to_file_name
from meshplane.launchers import BrokerProcess, EtcdServer, NatsServer
from tests.conftest import make_config
from tests.dynamo_runtime import (
    ENDPOINT,
    TOPIC,
    VERSION,
    dynamo,
    snapshot_metrics,
    snapshot_payload,
    snapshot_values,
)

SCOPE = Scope.endpoint(*ENDPOINT)
EVENTS = 20
GOLDEN = Path(__file__).resolve().parent.parent / "golden" / f"dynamo-{VERSION}"
# transport x discovery: ZeroMQ finds publishers through discovery (the file backend, etcd); NATS needs none;
# "-noext": without the C extension (pyzmq and the Python decoders and encoders, as where it is not built);
# "zmq-broker": through two meshplane brokers both sides name in DYN_ZMQ_BROKER_URL (each event goes through
# both; subscribers drop the second copy)
MODES = [("zmq", "file"), ("zmq", "etcd"), ("nats", "file"), ("zmq-noext", "file"), ("zmq-broker", "file")]


def setup(
    transport: str, discovery: str, tmp_path: Path, request: pytest.FixtureRequest, **kw: Any
) -> tuple[PlaneConfig, dict[str, str]]:
    """meshplane's configuration and the runtime's environment, on the same servers and discovery."""
    if transport.endswith("-noext"):
        request.getfixturevalue("monkeypatch").setenv("MESHPLANE_NO_EXTENSIONS", "1")
        transport = transport.removesuffix("-noext")
    env: dict[str, str] = {}
    if transport == "zmq-broker":
        brokers: list[BrokerProcess] = request.getfixturevalue("session_brokers")
        kw["zmq_brokers"] = tuple(b.address for b in brokers)
        xsubs, xpubs = ";".join(b.xsub for b in brokers), ";".join(b.xpub for b in brokers)
        env["DYN_ZMQ_BROKER_URL"] = f"xsub={xsubs} , xpub={xpubs}"
        transport = "zmq"
    nats_server: NatsServer | None = request.getfixturevalue("nats_server") if transport == "nats" else None
    etcd: EtcdServer | None = request.getfixturevalue("etcd_server") if discovery == "etcd" else None
    config = make_config(transport, discovery, tmp_path, nats_server, etcd, **kw)
    env["DYN_FILE_KV"] = str(config.file_kv)
    if nats_server:
        env["NATS_SERVER"] = nats_server.url
    if etcd:
        env["ETCD_ENDPOINTS"] = etcd.endpoint
    return config, env


def published(envelope: EventEnvelope) -> bool:
    """A snapshot the peer published, not one of the runtime's zeroed idle heartbeats (one a second)."""
    return bool(msgpack.unpackb(envelope.payload)["wall_time"])


async def within(sub: EventSubscriber, timeout: float) -> bool:
    """Whether ``sub`` receives an event within ``timeout`` seconds."""
    try:
        await sub.next(timeout)
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize(("transport", "discovery"), MODES, ids=lambda p: str(p))
async def test_a_meshplane_subscriber_receives_the_runtime_publisher(
    transport: str, discovery: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The runtime registers its publisher (ZeroMQ: its endpoint in a record of its own making), meshplane
    discovers it and receives every snapshot, decoded, in order, no gap counted."""
    config, env = setup(transport, discovery, tmp_path, request)
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(SCOPE, TOPIC)
        async with dynamo("pub", discovery, config.event_plane, tmp_path, **env) as runtime:
            got = [await sub.next(30)]  # an idle heartbeat (the runtime sends one a second): connected
            await runtime.send(f"publish {EVENTS}")
            assert (await runtime.read())["published"] == EVENTS
            while sum(map(published, got)) < EVENTS:
                got.append(await sub.next(30))
            stats = sub.stats  # while the runtime's record is there
    first = got[0]
    assert {(e.publisher_id, e.topic) for e in got} == {(first.publisher_id, TOPIC)}
    assert [e.sequence for e in got] == list(range(first.sequence, first.sequence + len(got)))
    assert [snapshot_metrics(e.payload) for e in got if published(e)] == [
        snapshot_values(i) for i in range(EVENTS)
    ]
    assert (stats.received, stats.gaps, stats.missing, stats.duplicates) == (len(got), 0, 0, 0)
    assert not stats.malformed
    assert not stats.invalid_records
    if config.event_plane == "zmq" and not config.broker_mode:  # found through the record the runtime wrote
        assert stats.publishers_discovered == 1


@pytest.mark.parametrize(("transport", "discovery"), MODES, ids=lambda p: str(p))
async def test_the_runtime_subscriber_receives_a_meshplane_publisher_and_no_heartbeat(
    transport: str, discovery: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A meshplane publisher in the Dynamo layout (the default): the runtime's subscriber (ZeroMQ: having
    found it through meshplane's record) receives every snapshot with its values, and none of the
    heartbeats meshplane sends between them, which a meshplane subscriber alongside does see."""
    config, env = setup(transport, discovery, tmp_path, request, heartbeat_period=0.05)
    # The runtime's subscriber gives up watching for good if the bucket folder is missing, or appears,
    # as it starts (1.6.1: "Failed to start discovery watch"); a deployment's exists once anyone registered.
    (config.file_kv / EVENT_CHANNELS_BUCKET).mkdir(parents=True)
    async with (
        dynamo("sub", discovery, config.event_plane, tmp_path, **env) as runtime,
        EventPlane(config) as plane,
    ):
        watcher = await plane.subscriber(SCOPE, TOPIC)
        pub = await plane.publisher(SCOPE, TOPIC)
        # Until both subscribers hear one: the runtime's connects once it has read our record (NATS: once its
        # subscription reached the server), and a ZeroMQ SUB loses what was sent before that.
        heard, watcher_heard, warm_ups = None, False, 0
        while heard is None or not watcher_heard:
            assert warm_ups < 150, (
                f"no warm-up event reached {'meshplane' if heard else 'the runtime'} in 30 s"
                + runtime.log_tail()
            )
            await pub.publish(snapshot_payload(warm_ups, "warm-up"))
            warm_ups += 1
            heard = heard or await runtime.poll(0.2)
            watcher_heard = watcher_heard or await within(watcher, 0.01)
        for i in range(EVENTS):
            await pub.send_heartbeat()  # besides the plane's own, every 0.05 s
            await pub.publish(snapshot_payload(i, "meshplane"))
        while (await watcher.next(30)).payload != snapshot_payload(EVENTS - 1, "meshplane"):
            pass
        heartbeats = watcher.stats.heartbeats  # on the wire between the events, if meshplane saw them
        last = snapshot_payload(EVENTS, "meshplane")
        await pub.publish(last)  # whatever the runtime takes for an event from us comes before this one
        received = [bytes.fromhex(heard["payload"])]
        while received[-1] != last:
            received.append(bytes.fromhex((await runtime.read(30))["payload"]))
    warm = {snapshot_payload(k, "warm-up") for k in range(warm_ups)}
    while received[0] in warm:
        received.pop(0)
    # an empty payload or a repeat among these would be a heartbeat the runtime took for an event
    assert received == [snapshot_payload(i, "meshplane") for i in range(EVENTS + 1)]
    assert [snapshot_metrics(p) for p in received] == [
        snapshot_values(i, "meshplane") for i in range(EVENTS + 1)
    ]
    assert heartbeats >= EVENTS


def golden_record(transport: str) -> tuple[str, str, bytes]:
    """The key, file name and content of the record the runtime wrote (tests/golden/dynamo-1.6.1)."""
    folder = GOLDEN / "file-kv" / transport
    [path] = sorted(p for p in folder.rglob("*") if p.is_file())
    bucket, name = path.relative_to(folder).as_posix().rsplit("/", 1)
    return file_name_to_key(bucket, name), name, path.read_bytes()


def without_ids(record: dict[str, Any]) -> dict[str, Any]:
    """A record with its id and address blanked (key order kept)."""
    config = dict(record["transport"]["config"])
    if "endpoint" in config:
        config["endpoint"] = "tcp://127.0.0.1:*"
    return {**record, "instance_id": 0, "transport": {**record["transport"], "config": config}}


@pytest.mark.parametrize(
    ("transport", "discovery"),
    [(t, d) for t in ("zmq", "nats") for d in ("file", "etcd")],
    ids=lambda p: str(p),
)
async def test_meshplane_publishers_register_the_records_the_runtime_registers(
    transport: str, discovery: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """What a meshplane publisher writes equals what the runtime wrote (tests/golden/dynamo-1.6.1),
    key, fields and their order, but for the id and the port."""
    their_key, their_name, their_value = golden_record(transport)
    config, _ = setup(transport, discovery, tmp_path, request)
    async with EventPlane(config) as plane:
        pub = await plane.publisher(SCOPE, TOPIC)
        records = await (await plane.discovery()).list(EVENT_CHANNELS_BUCKET)
        [(key, value)] = [(k, v) for k, v in records.items() if k.endswith(f"/{pub.publisher_id:x}")]
        bucket, name = key_to_file_name(key)
        if discovery == "file":  # the file the record is in, named as the runtime names its own
            assert (config.file_kv / bucket / name).read_bytes() == value
    assert name.rsplit("%2F", 1)[0] == their_name.rsplit("%2F", 1)[0]
    assert their_key.rsplit("/", 1)[1] == f"{json.loads(their_value)['instance_id']:x}"
    assert key == f"{their_key.rsplit('/', 1)[0]}/{pub.publisher_id:x}"
    ours, expected = json.loads(value), json.loads(their_value)
    assert json.dumps(without_ids(ours)) == json.dumps(without_ids(expected))  # same fields, same order
    assert value == json.dumps(ours, separators=(",", ":")).encode()  # compact, as the runtime's
