import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane import InvalidDiscoveryRecord, InvalidName, Scope
from meshplane.core.records import EventChannel, file_name_to_key, key_to_file_name
from meshplane.discovery.channels import parse_channel

SPEC_RECORD = (
    '{"type":"EventChannel",'
    '"scope":{"kind":"endpoint","endpoint":{"namespace":"probe","component":"worker","name":"generate"}},'
    '"topic":"forward-pass-metrics","instance_id":6638353960351422,'
    '"transport":{"kind":"Zmq","config":{"endpoint":"tcp://127.0.0.1:36111"}}}'
)


def spec_channel() -> EventChannel:
    return EventChannel(
        Scope.endpoint("probe", "worker", "generate"),
        "forward-pass-metrics",
        6638353960351422,
        "Zmq",
        {"endpoint": "tcp://127.0.0.1:36111"},
    )


def test_record_json_is_byte_identical_to_the_spec_example():
    assert spec_channel().to_json().decode() == SPEC_RECORD


def test_spec_record_parses():
    channel = EventChannel.from_json(SPEC_RECORD.encode())
    assert channel == spec_channel()
    assert channel.zmq_endpoint == "tcp://127.0.0.1:36111"


def test_nats_record():
    scope = Scope.endpoint("probe", "worker", "generate")
    channel = EventChannel(scope, "t", 1, "Nats", {"subject_prefix": scope.subject_prefix})
    assert json.loads(channel.to_json())["transport"] == {
        "kind": "Nats",
        "config": {"subject_prefix": "namespace.probe.component.worker.endpoint.generate"},
    }
    assert channel.zmq_endpoint is None


@pytest.mark.parametrize("scope", [Scope.component("a", "b"), Scope.namespace("a")])
def test_other_scopes_round_trip(scope):
    channel = EventChannel(scope, "t", 7, "Zmq", {"endpoint": "tcp://h:1"})
    assert EventChannel.from_json(channel.to_json()) == channel


@pytest.mark.parametrize(
    ("scope", "nested"),
    [
        (Scope.component("a", "b"), {"kind": "component", "component": {"namespace": "a", "name": "b"}}),
        (Scope.namespace("a"), {"kind": "namespace", "namespace": {"name": "a"}}),
    ],
)
def test_scopes_meshplane_once_wrote_nested_are_still_read(scope, nested):
    """meshplane 0.1.0's form of these two (Dynamo's is in tests/unit/test_dynamo_golden.py)."""
    channel = EventChannel(scope, "t", 7, "Zmq", {"endpoint": "tcp://h:1"})
    old = {**json.loads(channel.to_json()), "scope": nested}
    assert EventChannel.from_json(json.dumps(old).encode()) == channel


def mutate(**changes: object) -> bytes:
    value = json.loads(SPEC_RECORD)
    value.update(changes)
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1,2]", "not a JSON object"),
        (b"[" * 60_000, "not JSON"),  # nested past the parser's recursion limit
        (b" " * 70_000 + b"{}", "larger than"),
        (mutate(type="Endpoint"), "not 'EventChannel'"),
        (mutate(instance_id=-1), "not a u64"),
        (mutate(instance_id="12"), "not a u64"),
        (mutate(instance_id=True), "not a u64"),
        (mutate(instance_id=2**64), "not a u64"),
        (mutate(transport={"config": {}}), "transport.kind"),
        (mutate(transport={"kind": "Zmq", "config": []}), "config is not an object"),
        (mutate(topic="a.b"), "contains"),
        (mutate(topic=None), "must be a string"),
        (mutate(scope={"kind": "galaxy", "galaxy": {}}), "unknown scope kind"),
        (mutate(scope={"kind": "endpoint"}), "no matching body"),
        (mutate(scope={"kind": "endpoint", "endpoint": {"namespace": "a"}}), "must be a string"),
        (mutate(scope="x"), "no scope object"),
    ],
)
def test_garbage_records_get_clear_errors(data, message):
    with pytest.raises(InvalidDiscoveryRecord, match=message):
        EventChannel.from_json(data)


def test_a_record_under_the_wrong_key_is_rejected():
    with pytest.raises(InvalidDiscoveryRecord, match="stored under"):
        parse_channel("v1/event_channels/namespace/other/topic/t/1", SPEC_RECORD.encode())
    assert parse_channel(spec_channel().key, SPEC_RECORD.encode()) == spec_channel()


def test_file_layout_matches_dynamo():
    bucket, name = key_to_file_name(spec_channel().key)
    assert bucket == "v1/event_channels"
    assert name == (
        "namespace%2Fprobe%2Fcomponent%2Fworker%2Fendpoint%2Fgenerate%2Ftopic%2F"
        "forward%2Dpass%2Dmetrics%2F17958c39b336be"
    )
    assert key_to_file_name("v1/event_channels/a_b")[1] == "a%5Fb"


@given(st.text(min_size=1, max_size=60))
def test_file_names_round_trip(rest):
    key = f"v1/event_channels/{rest}"
    bucket, name = key_to_file_name(key)
    assert name.isascii()
    assert "/" not in name
    assert file_name_to_key(bucket, name) == key


@pytest.mark.parametrize("name", ["a%2", "a%zz", "a-b", "a%+1", "%FF"])
def test_bad_file_names_are_rejected(name):
    with pytest.raises(InvalidName):
        file_name_to_key("v1/event_channels", name)
