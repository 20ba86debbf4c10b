"""The MQTT door's codec and topic mapping (meshplane.core.doors.mqtt_*): round trips, the server's
rules, and fuzz (arbitrary bytes, split anywhere, never anything but MqttError)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.doors.mqtt_codec import MqttReader
from meshplane.core.doors.mqtt_packets import (
    V5,
    V311,
    Code,
    ConnAck,
    Connect,
    Disconnect,
    MqttError,
    Packet,
    PingReq,
    Prop,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
    encode_puback,
    varint,
)
from meshplane.core.doors.mqtt_topics import BadTopic, matches, shared, to_pattern, to_subject, to_topic

text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20)
packet_ids = st.integers(1, 0xFFFF)
levels = st.sampled_from([V311, V5])


def user_properties(level: int) -> st.SearchStrategy[dict[int, object]]:
    if level != V5:
        return st.just({})
    return st.fixed_dictionaries(
        {},
        optional={
            Prop.USER_PROPERTY: st.lists(st.tuples(text, text), min_size=1, max_size=3).map(tuple),
            Prop.CONTENT_TYPE: text,
            Prop.MESSAGE_EXPIRY: st.integers(0, 2**32 - 1),
        },
    )


@st.composite
def connects(draw: st.DrawFn, level: int | None = None) -> Connect:
    level = draw(levels) if level is None else level
    will = None
    if draw(st.booleans()):
        will = Will(draw(text), draw(st.binary(max_size=50)), draw(st.integers(0, 2)), draw(st.booleans()))
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=20)) if username is not None or level == V5 else None
    properties = draw(user_properties(level))
    return Connect(
        level,
        draw(text),
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        will,
        properties,
    )


@st.composite
def client_packets(draw: st.DrawFn, level: int) -> Packet:
    kind = draw(st.sampled_from(["publish", "puback", "subscribe", "unsubscribe", "ping", "disconnect"]))
    if kind == "publish":
        qos = draw(st.integers(0, 1))
        return Publish(
            draw(text),
            draw(st.binary(max_size=100)),
            qos,
            draw(st.booleans()),
            draw(st.booleans()) if qos else False,
            draw(packet_ids) if qos else 0,
            draw(user_properties(level)),
        )
    if kind == "puback":
        return PubAck(draw(packet_ids))
    if kind == "subscribe":
        filters = draw(st.lists(st.tuples(text, st.integers(0, 2)), min_size=1, max_size=4))
        return Subscribe(draw(packet_ids), tuple(filters))
    if kind == "unsubscribe":
        return Unsubscribe(draw(packet_ids), tuple(draw(st.lists(text, min_size=1, max_size=4))))
    if kind == "ping":
        return PingReq()
    return Disconnect(draw(st.sampled_from([0, 4])) if level == V5 else 0)


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Packet], bytes]:
    connect = draw(connects())
    packets: list[Packet] = [connect, *draw(st.lists(client_packets(connect.level), max_size=8))]
    return packets, b"".join(encode(p, connect.level) for p in packets)


@given(sessions())
@settings(max_examples=300)
def test_client_packets_round_trip(session: tuple[list[Packet], bytes]) -> None:
    packets, data = session
    got = MqttReader().feed(data)
    assert len(got) == len(packets)
    for sent, read in zip(packets, got, strict=True):
        assert type(sent) is type(read)
        assert _fields(sent) == _fields(read)


def _fields(packet: Packet) -> dict[str, object]:
    values = {name: getattr(packet, name) for name in getattr(packet, "__slots__", ())}
    for name, value in list(values.items()):
        if name == "properties":
            values[name] = dict(value)
        if isinstance(value, Will):
            values[name] = (value.topic, value.payload, value.qos, value.retain, dict(value.properties))
    return values


@given(sessions(), st.lists(st.integers(0, 2000), max_size=10))
@settings(max_examples=300)
def test_split_anywhere_reads_the_same(session: tuple[list[Packet], bytes], cuts: list[int]) -> None:
    _, data = session
    whole = MqttReader().feed(data)
    reader, pieces = MqttReader(), []
    start = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        pieces += reader.feed(data[start:cut])
        start = cut
    assert [_fields(p) for p in pieces] == [_fields(p) for p in whole]


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=5))
@settings(max_examples=1000)
def test_arbitrary_bytes_raise_only_mqtt_errors(data: bytes, cuts: list[int]) -> None:
    for prefix in (b"", encode(Connect(V311, "x"), V311), encode(Connect(V5, "x"), V5)):
        reader = MqttReader(max_packet_size=200, max_connect_size=200)
        stream = prefix + data
        start = 0
        try:
            for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
                reader.feed(stream[start:cut])
                start = cut
        except MqttError:
            with pytest.raises(MqttError) as again:
                reader.feed(b"")  # over: the same error again
            assert again.value.reason
        assert len(reader._buffer) <= 205


@given(sessions(), st.integers(0, 10_000), st.integers(0, 255))
@settings(max_examples=500)
def test_a_corrupted_byte_raises_only_mqtt_errors(
    session: tuple[list[Packet], bytes], at: int, value: int
) -> None:
    _, data = session
    corrupt = bytearray(data)
    corrupt[at % len(corrupt)] = value
    with contextlib.suppress(MqttError):
        MqttReader().feed(bytes(corrupt))


@given(levels, st.sampled_from([ConnAck(True, 0), ConnAck(False, Code.BAD_USER_OR_PASSWORD)]))
def test_server_packets_encode(level: int, packet: ConnAck) -> None:
    data = encode(packet, level)
    assert data[0] == 0x20
    if level == V311:
        assert data[3] in (0, 4)


@given(levels, packet_ids)
def test_the_fast_puback_is_the_general_one(level: int, packet_id: int) -> None:
    assert encode_puback(packet_id) == encode(PubAck(packet_id), level)
    reader = MqttReader()
    (_, ack) = reader.feed(encode(Connect(level, "c"), level) + encode_puback(packet_id))
    assert ack == PubAck(packet_id)


def test_varint_bounds() -> None:
    assert varint(0) == b"\x00"
    assert varint(127) == b"\x7f"
    assert varint(128) == b"\x80\x01"
    assert varint(268_435_455) == b"\xff\xff\xff\x7f"
    with pytest.raises(ValueError, match="does not fit"):
        varint(268_435_456)


def test_a_fifth_length_byte_is_malformed() -> None:
    reader = MqttReader()
    with pytest.raises(MqttError) as caught:
        reader.feed(b"\x10\xff\xff\xff\xff\x01")
    assert caught.value.reason == "bad_length"


def test_an_oversized_remaining_length_is_refused_from_the_header() -> None:
    reader = MqttReader(max_packet_size=1000, max_connect_size=100)
    with pytest.raises(MqttError) as caught:
        reader.feed(b"\x10" + varint(200))  # a CONNECT of 200 bytes, only its header sent
    assert caught.value.reason == "too_large"
    assert caught.value.code == Code.PACKET_TOO_LARGE
    connected = MqttReader(max_packet_size=1000)
    connected.feed(encode(Connect(V5, "c"), V5))
    with pytest.raises(MqttError, match="1000"):
        connected.feed(b"\x30" + varint(5000))


def test_the_first_packet_must_be_connect() -> None:
    with pytest.raises(MqttError) as caught:
        MqttReader().feed(encode(PingReq(), V311))
    assert caught.value.reason == "no_connect"


def test_a_second_connect_is_a_protocol_error() -> None:
    reader = MqttReader()
    assert [type(p) for p in reader.feed(encode(Connect(V311, "a"), V311) * 2)] == [Connect]
    assert reader.error is not None
    with pytest.raises(MqttError) as caught:
        reader.feed(b"")  # the error after the packets that came before it
    assert caught.value.reason == "second_connect"


def test_qos2_publish_is_refused_with_its_reason_code() -> None:
    reader = MqttReader()
    reader.feed(encode(Connect(V5, "a"), V5))
    with pytest.raises(MqttError) as caught:
        reader.feed(encode(Publish("t", b"x", 2, packet_id=1), V5))
    assert caught.value.reason == "qos2"
    assert caught.value.code == Code.QOS_NOT_SUPPORTED


@pytest.mark.parametrize("kind", [0x50, 0x62, 0x70, 0xF0, 0x20, 0x90, 0xB0, 0xD0])
def test_packets_a_client_does_not_send_are_refused(kind: int) -> None:
    reader = MqttReader()
    reader.feed(encode(Connect(V5, "a"), V5))
    with pytest.raises(MqttError) as caught:
        reader.feed(bytes([kind, 2, 0, 1]))
    assert caught.value.reason == "unexpected_packet"


def test_unsupported_protocol_level_is_answered_at_connack() -> None:
    body = b"\x00\x04MQTT\x03\x02\x00\x3c\x00\x01a"
    with pytest.raises(MqttError) as caught:
        MqttReader().feed(b"\x10" + varint(len(body)) + body)
    assert caught.value.in_connect
    assert caught.value.code == Code.UNSUPPORTED_VERSION


def test_a_topic_alias_is_refused() -> None:
    reader = MqttReader()
    reader.feed(encode(Connect(V5, "a"), V5))
    with pytest.raises(MqttError) as caught:
        reader.feed(encode(Publish("t", b"", properties={Prop.TOPIC_ALIAS: 1}), V5))
    assert caught.value.code == Code.TOPIC_ALIAS_INVALID


def test_server_packets_of_each_version() -> None:
    assert encode(PubAck(7), V311) == b"\x40\x02\x00\x07"
    assert encode(PubAck(7, Code.NOT_AUTHORIZED), V5) == b"\x40\x03\x00\x07\x87"
    assert encode(SubAck(1, (0, 1, 0x87)), V311) == b"\x90\x05\x00\x01\x00\x01\x80"
    assert encode(UnsubAck(3, (0,)), V311) == b"\xb0\x02\x00\x03"
    assert encode(UnsubAck(3, (0,)), V5) == b"\xb0\x04\x00\x03\x00\x00"
    assert encode(Disconnect(Code.QOS_NOT_SUPPORTED), V5) == b"\xe0\x02\x9b\x00"
    assert encode(Disconnect(), V311) == b"\xe0\x00"


# --- topics ---------------------------------------------------------------------------------------


def test_topics_map_to_subjects_and_back() -> None:
    assert to_subject("a/b/c") == "a.b.c"
    assert to_topic("a.b.c") == "a/b/c"
    assert to_pattern("a/+/c") == "a.*.c"
    assert to_pattern("a/#") == "a.#"
    assert to_pattern("#") == "#"
    assert to_pattern("+") == "*"


@pytest.mark.parametrize(
    "topic",
    ["", "a.b", "a//b", "/a", "a/", "$SYS/x", "a/+", "a/#", "a/*", "a/>", "a b", "x/" * 40 + "y"],
)
def test_topics_that_cannot_map_are_refused(topic: str) -> None:
    with pytest.raises(BadTopic):
        to_subject(topic)


@pytest.mark.parametrize("topic_filter", ["", "a/#/b", "a+/b", "a/b#", "$share/g/a", "a.b/#", "a//#", "*"])
def test_filters_that_cannot_map_are_refused(topic_filter: str) -> None:
    with pytest.raises(BadTopic):
        to_pattern(topic_filter)


level_words = st.text("abcxyz09-_", min_size=1, max_size=4)


@given(level_words, st.lists(level_words | st.sampled_from(["+", "#"]), min_size=1, max_size=4))
def test_a_shared_filter_splits_into_its_group_and_filter(group: str, words: list[str]) -> None:
    topic_filter = "/".join(words)
    assert shared(f"$share/{group}/{topic_filter}") == (group, topic_filter)
    assert shared(topic_filter) is None


@given(st.text(max_size=30))
def test_any_shared_filter_splits_or_is_refused_as_a_bad_topic(rest: str) -> None:
    try:
        found = shared("$share/" + rest)
    except BadTopic:
        return
    assert found is not None
    group, topic_filter = found
    assert group
    assert topic_filter
    assert not set(group) & set("/+#")
    assert f"{group}/{topic_filter}" == rest


@pytest.mark.parametrize("bad", ["", "/a", "g", "g/", "g+/a", "g#/a", "é/a", "a.b/c"])
def test_bad_share_names_are_refused(bad: str) -> None:
    with pytest.raises(BadTopic):
        shared("$share/" + bad)


@given(st.lists(level_words, min_size=1, max_size=6))
def test_a_topic_round_trips(words: list[str]) -> None:
    topic = "/".join(words)
    assert to_topic(to_subject(topic)) == topic


@given(
    st.lists(level_words | st.just("+"), min_size=1, max_size=5),
    st.booleans(),
    st.lists(level_words, min_size=1, max_size=6),
)
def test_matching_follows_mqtt(words: list[str], hash_end: bool, topic_words: list[str]) -> None:
    """The mesh pattern matches exactly the topics MQTT's filter does (MQTT's rule written out)."""
    filter_words = words + (["#"] if hash_end else [])
    pattern = to_pattern("/".join(filter_words))

    def mqtt_matches(f: list[str], t: list[str]) -> bool:
        if not f:
            return not t
        if f[0] == "#":
            return True
        if not t:
            return False
        return (f[0] == "+" or f[0] == t[0]) and mqtt_matches(f[1:], t[1:])

    subject = to_subject("/".join(topic_words))
    assert matches(pattern, subject) == mqtt_matches(filter_words, topic_words)


def _read_pieces(data: bytes, cuts: list[int]) -> tuple[list[dict[str, object]], str | None]:
    reader, packets = MqttReader(max_packet_size=500, max_connect_size=500), []
    start = 0
    try:
        for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
            packets += reader.feed(data[start:cut])
            start = cut
        reader.feed(b"")
    except MqttError as exc:
        return [_fields(p) for p in packets], exc.reason
    return [_fields(p) for p in packets], None


@given(sessions(), st.binary(max_size=60), st.lists(st.integers(0, 3000), max_size=8))
@settings(max_examples=500)
def test_split_anywhere_gives_the_same_packets_and_the_same_error(
    session: tuple[list[Packet], bytes], tail: bytes, cuts: list[int]
) -> None:
    """Whatever the reads' boundaries, the same packets come out, then the same error (or none)."""
    data = session[1] + tail
    assert _read_pieces(data, cuts) == _read_pieces(data, [])
