"""meshplane against what the Dynamo runtime 1.6.1 itself wrote and sent (tests/golden/dynamo-1.6.1/,
captured by ``python -m tests.capture_dynamo_golden``): its discovery records read as it wrote them,
meshplane's records equal to its own but for ids and addresses, its wire messages decoded and
re-encoded byte for byte."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from meshplane import EventEnvelope, Scope
from meshplane.core.framing import MessageType, decode_nats, decode_zmq, dynamo_zmq_frames, encode_nats
from meshplane.core.records import TRANSPORT_ZMQ_BROKER, EventChannel, file_name_to_key, key_to_file_name
from meshplane.discovery.channels import parse_channel
from tests.dynamo_runtime import ENDPOINT, TOPIC, VERSION, WORKER_ID, snapshot_payload

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / f"dynamo-{VERSION}"
SCOPE = Scope.endpoint(*ENDPOINT)


def golden_files(folder: str) -> list[Path]:
    files = sorted(p for p in (GOLDEN / folder).rglob("*") if p.is_file())
    assert files, f"no golden records in {GOLDEN / folder}: python -m tests.capture_dynamo_golden"
    return files


def golden_json(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text())


def as_key(root: Path, path: Path) -> str:
    """The discovery key of a file the runtime's file backend wrote (``<bucket>/<escaped key>``)."""
    bucket, name = path.relative_to(root).as_posix().rsplit("/", 1)
    return file_name_to_key(bucket, name)


FILE_RECORDS = [(plane, path) for plane in ("zmq", "nats") for path in golden_files(f"file-kv/{plane}")]


@pytest.mark.parametrize(("plane", "path"), FILE_RECORDS, ids=lambda v: v if isinstance(v, str) else "")
def test_meshplane_reads_each_file_record_as_the_runtime_wrote_it(plane: str, path: Path) -> None:
    key = as_key(GOLDEN / "file-kv" / plane, path)
    channel = parse_channel(key, path.read_bytes())  # also: filed under the key meshplane derives from it
    assert key_to_file_name(key) == tuple(
        path.relative_to(GOLDEN / "file-kv" / plane).as_posix().rsplit("/", 1)
    )
    assert (channel.scope, channel.topic) == (SCOPE, TOPIC)
    assert key.rsplit("/", 1)[1] == f"{channel.instance_id:x}"
    if plane == "zmq":
        assert channel.zmq_endpoint is not None
        assert channel.zmq_endpoint.startswith("tcp://127.0.0.1:")
    else:
        assert (channel.transport_kind, channel.transport_config) == (
            "Nats",
            {"subject_prefix": SCOPE.subject_prefix},
        )


@pytest.mark.parametrize(("plane", "path"), FILE_RECORDS, ids=lambda v: v if isinstance(v, str) else "")
def test_meshplane_writes_the_record_the_runtime_writes(plane: str, path: Path) -> None:
    """Byte for byte, given the same id and address (the key, every field, their order, compact JSON)."""
    theirs = json.loads(path.read_bytes())
    config = (
        {"endpoint": theirs["transport"]["config"]["endpoint"]}
        if plane == "zmq"
        else {"subject_prefix": SCOPE.subject_prefix}
    )
    ours = EventChannel(SCOPE, TOPIC, theirs["instance_id"], "Zmq" if plane == "zmq" else "Nats", config)
    assert ours.to_json() == path.read_bytes()
    assert ours.key == as_key(GOLDEN / "file-kv" / plane, path)


def test_meshplane_reads_the_runtime_etcd_record() -> None:
    [record] = golden_json("etcd-zmq.json")
    channel = parse_channel(record["key"], record["value"].encode())
    assert (channel.scope, channel.topic, channel.transport_kind) == (SCOPE, TOPIC, "Zmq")
    assert EventChannel(SCOPE, TOPIC, channel.instance_id, "Zmq", channel.transport_config).to_json() == (
        record["value"].encode()
    )
    assert record["lease_ttl"]  # attached to the process's lease: it goes when the process does


@pytest.mark.parametrize("kind", ["component", "namespace"])
def test_other_scopes_are_written_and_read_as_the_runtime_reads_them(kind: str) -> None:
    """The runtime's own records are all endpoint-scoped; these forms are the ones it accepted (in a
    broker record: it logs and skips a record whose scope it cannot read)."""
    theirs = golden_json("scopes.json")[kind]
    scope = (
        Scope.component(ENDPOINT[0], "zmq_broker") if kind == "component" else Scope.namespace(ENDPOINT[0])
    )
    record = EventChannel(scope, "broker", 31, "Zmq", {"endpoint": "tcp://127.0.0.1:1"})
    assert json.loads(record.to_json())["scope"] == theirs
    assert (
        EventChannel.from_json(json.dumps({**json.loads(record.to_json()), "scope": theirs}).encode())
        == record
    )


def test_meshplane_reads_the_broker_record_the_runtime_accepts() -> None:
    """1.6.1 ships no broker, so no broker record of its own exists: this one (ours) is in the layout its
    publishers and subscribers read with ``DYN_ZMQ_BROKER_ENABLED`` (an event channel of the component
    ``zmq_broker`` of their namespace), and the capture checked that the runtime used it."""
    [path] = golden_files("broker")
    channel = parse_channel(as_key(GOLDEN / "broker", path), path.read_bytes())
    assert (channel.scope, channel.transport_kind) == (
        Scope.component(ENDPOINT[0], "zmq_broker"),
        TRANSPORT_ZMQ_BROKER,
    )
    assert set(channel.transport_config) == {"xsub_endpoints", "xpub_endpoints"}


def runtime_envelope(envelope: bytes) -> EventEnvelope:
    value = msgpack.unpackb(envelope)
    assert list(value) == ["publisher_id", "sequence", "published_at", "topic", "payload"]
    return EventEnvelope(**value)


@pytest.mark.parametrize(("name", "frame0"), [("zmq-event.json", TOPIC), ("broker-event.json", None)])
def test_the_runtime_zmq_frames_decode_and_meshplane_encodes_them_byte_for_byte(
    name: str, frame0: str | None
) -> None:
    frames = [bytes.fromhex(f) for f in golden_json(name)["frames"]]
    envelope = runtime_envelope(frames[3][5:])
    routing = (frame0 or SCOPE.subject(TOPIC)).encode()  # broker mode: the full subject
    assert decode_zmq(frames) == (MessageType.EVENT, envelope, routing)
    assert [bytes(f) for f in dynamo_zmq_frames(routing, envelope)] == frames
    assert msgpack.unpackb(envelope.payload)["worker_id"] == WORKER_ID


def test_the_runtime_nats_message_is_the_bare_envelope_meshplane_sends() -> None:
    message = golden_json("nats-event.json")
    data = bytes.fromhex(message["data"])
    envelope = runtime_envelope(data)
    assert message["subject"] == SCOPE.subject(TOPIC)
    assert message["headers"] is None
    assert decode_nats(data, TOPIC.encode()) == (MessageType.EVENT, envelope, TOPIC.encode())
    assert encode_nats(envelope) == data


def test_the_tests_snapshot_payloads_have_the_runtime_layout() -> None:
    """The payloads the interop tests publish to the runtime's subscriber are laid out as its own."""
    frames = [bytes.fromhex(f) for f in golden_json("zmq-event.json")["frames"]]
    theirs = msgpack.unpackb(runtime_envelope(frames[3][5:]).payload)
    ours = msgpack.unpackb(snapshot_payload(0, WORKER_ID))
    assert json.dumps(ours) == json.dumps({**theirs, "counter_id": ours["counter_id"]})
