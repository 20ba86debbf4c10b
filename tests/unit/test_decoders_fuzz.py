"""Every decoder that takes bytes or text from outside, fed anything: it answers with its own clear
error (which callers count and turn into a 4xx), never with another exception; and what it accepts
is what it promises (encoded again, it reads back the same; its fields have the checked types)."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from meshplane.core import streamlog
from meshplane.core.brokers import parse_broker_record
from meshplane.core.mesh.frames import (
    Frame,
    FrameError,
    FrameReader,
    FrameType,
    decode_hello,
    decode_spooled,
    decode_sync,
    encode_event,
    encode_payload,
)
from meshplane.core.records import EventChannel
from meshplane.core.streamlog import RetentionPolicy, audit_segment, decode_event, encode_record
from meshplane.core.subjects import InvalidSubject, validate
from meshplane.errors import ConfigError, InvalidDiscoveryRecord
from meshplane.streams.access import Tokens
from meshplane.streams.errors import BadRequest, StreamError
from meshplane.streams.http.params import parse_json_object

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
JSON_BYTES = JSON.map(lambda v: json.dumps(v).encode())
RECORD_LIKE = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["EventChannel", "x"]),
        "instance_id": JSON,
        "transport": JSON,
        "topic": JSON,
        "scope": JSON,
    }
).map(lambda v: json.dumps(v).encode())


@given(st.binary(max_size=300) | JSON_BYTES | RECORD_LIKE)
def test_discovery_records(data: bytes) -> None:
    try:
        channel = EventChannel.from_json(data)
    except InvalidDiscoveryRecord:
        return
    assert type(channel.instance_id) is int
    assert 0 <= channel.instance_id < 2**64
    assert isinstance(channel.topic, str)
    assert isinstance(channel.transport_kind, str)
    assert EventChannel.from_json(channel.to_json()) == channel


@given(st.binary(max_size=300) | JSON_BYTES)
def test_broker_records(data: bytes) -> None:
    try:
        address = parse_broker_record(data)
    except InvalidDiscoveryRecord:
        return
    assert address.xsub.startswith(("tcp://", "ipc://", "inproc://"))
    assert address.xpub.startswith(("tcp://", "ipc://", "inproc://"))


@given(st.binary(max_size=300))
@example(b"\x92\xa2\x00\x80")  # a string that is not UTF-8: msgspec raised UnicodeDecodeError
def test_stored_events(data: bytes) -> None:
    try:
        event = decode_event(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    assert isinstance(event.id, str)
    assert isinstance(event.event_type, str)
    assert decode_event(streamlog.encode_event(event)) == event


@given(st.lists(st.binary(max_size=60), max_size=6), st.binary(max_size=80), st.integers(0, 400))
def test_segment_audit_of_damaged_bytes(payloads: list[bytes], garbage: bytes, at: int) -> None:
    data = b"".join(encode_record(i, 0, p) for i, p in enumerate(payloads))
    damaged = data[:at] + garbage + data[at:]
    audit = audit_segment(damaged, 0)
    assert audit.records <= len(payloads) + len(garbage) // 24
    assert audit.valid_bytes <= len(damaged)
    if not garbage or at >= len(data):
        assert audit.records == len(payloads)


@given(JSON)
def test_retention_policies(raw: object) -> None:
    try:
        policy = RetentionPolicy.from_json(raw)
    except ValueError:
        return
    assert RetentionPolicy.from_json(policy.to_json()) == policy


@given(st.binary(max_size=200) | JSON_BYTES)
def test_request_bodies(raw: bytes) -> None:
    try:
        body = parse_json_object(raw, "body")
    except BadRequest:  # a 400, and no other error
        return
    assert isinstance(body, dict)
    assert body == (json.loads(raw) if raw.strip() else {})  # an empty body is an empty object


@given(st.text(max_size=80))
def test_subjects_and_patterns(text: str) -> None:
    for wildcards in (False, True):
        try:
            valid = validate(text, wildcards=wildcards)
        except InvalidSubject:
            continue
        tokens = valid.split(".")
        assert valid == text
        assert "" not in tokens
        assert valid.isprintable()
        assert not any(c.isspace() for c in valid)
        assert len(valid.encode("utf-8", "surrogatepass")) <= 1024
        assert wildcards or not {"*", ">", "#"} & set(tokens)
        assert not {">", "#"} & set(tokens[:-1])


@given(st.text(max_size=200))
def test_token_files(text: str) -> None:
    try:
        tokens = Tokens.parse(text)
    except ConfigError:
        return
    for line in text.splitlines():  # each token the file names is accepted, and long enough
        words = line.split("#", 1)[0].split()
        if words:
            assert len(words[0]) >= 16
            assert tokens.grant_for(words[0]) is not None


def test_a_deeply_nested_body_is_a_400() -> None:
    with pytest.raises(StreamError, match="nested too deeply"):
        parse_json_object(b"[" * 100_000, "body")


@given(st.binary(max_size=400))
@example(b"\x87\xa2\x00\x80")
def test_mesh_handshakes_and_sync_answers(data: bytes) -> None:
    for decode in (decode_hello, decode_sync):
        try:
            decoded = decode(data)
        except ValueError:
            continue
        assert decode(encode_payload(decoded)) == decoded


@given(st.lists(st.binary(max_size=120), max_size=8))
def test_mesh_frame_streams(chunks: list[bytes]) -> None:
    reader = FrameReader(max_payload=1000)
    for chunk in chunks:
        for item in reader.feed(chunk):
            assert isinstance(item, Frame | FrameError)


@given(st.binary(max_size=300), st.integers(0, 400))
def test_spooled_frames_carry_one_event_or_are_refused(garbage: bytes, cut: int) -> None:
    event = encode_event("origin", "a.b", 1, 2, garbage)
    for payload in (garbage, event[:cut], event + garbage[:cut], garbage[:cut] + event):
        try:
            inner = decode_spooled(Frame(FrameType.SPOOLED, 0, "n", "", 1, payload))
        except ValueError:
            continue
        assert inner.type is FrameType.EVENT
        assert inner.raw == payload
