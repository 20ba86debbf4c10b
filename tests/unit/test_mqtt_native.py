"""The MQTT door's C fast path (``core/doors/_mqtt.c``) against the Python reader, its reference: the
same packets and the same errors on any stream after a CONNECT, split at every point hypothesis
picks (plain PUBLISHes and PUBACKs read in C, the rest by the reader from where C stopped)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from meshplane.core.doors.mqtt_codec import Item, MqttReader, native_read_run
from meshplane.core.doors.mqtt_packets import (
    V5,
    V311,
    Connect,
    MqttError,
    Packet,
    PingReq,
    Prop,
    PubAck,
    Publish,
    Subscribe,
    encode,
    encode_publish,
    publish_bytes,
    varint,
)

pytestmark = pytest.mark.skipif(native_read_run is None, reason="the C extension is not built")

MAX_PACKET = 80
topics = st.one_of(
    st.text(max_size=12),  # U+0000 and surrogates' neighbours too
    st.binary(max_size=6).map(lambda raw: raw.decode("latin-1")),
)


@st.composite
def packets(draw: st.DrawFn, level: int) -> bytes:
    """One packet's bytes: mostly the ones C takes, with every way of being not quite one of them."""
    choice = draw(st.integers(0, 9))
    if choice <= 3:
        qos = draw(st.integers(0, 1))
        props: dict[int, object] = {}
        if level == V5 and draw(st.integers(0, 4)) == 0:
            props = {Prop.CONTENT_TYPE: "t"} if draw(st.booleans()) else {Prop.TOPIC_ALIAS: 3}
        packet = Publish(
            draw(st.text(max_size=10)),
            draw(st.binary(max_size=40)),
            qos,
            draw(st.booleans()),
            draw(st.booleans()) and bool(qos),
            draw(st.integers(1, 0xFFFF)) if qos else 0,
            props,
        )
        return encode(packet, level)
    if choice == 4:
        return encode(PubAck(draw(st.integers(1, 0xFFFF))), V311)
    if choice == 5:  # a PUBLISH's fixed header and fields as they come: any flags, id, topic bytes
        topic = draw(topics).encode("utf-8", "surrogatepass")
        body = len(topic).to_bytes(2, "big") + topic + draw(st.binary(max_size=6))
        return bytes([0x30 | draw(st.integers(0, 15))]) + varint(len(body)) + body
    if choice == 6:  # a PUBACK's, likewise
        body = draw(st.binary(max_size=4))
        return bytes([0x40 | draw(st.integers(0, 15))]) + varint(len(body)) + body
    if choice == 7:
        return encode(Subscribe(draw(st.integers(1, 9)), (("a/+", 1),)), level)
    if choice == 8:
        return encode(PingReq(), level)
    return draw(st.binary(max_size=8))  # anything, a remaining length too long or past the limit too


def run(reader: MqttReader, chunks: list[bytes], fast: bool) -> tuple[list[Packet], str]:
    """What ``reader`` reads from ``chunks``: its packets (C's items made packets) and its first error."""
    seen: list[Packet] = []
    for chunk in chunks:
        try:
            items: list[Item] = reader.feed_fast(chunk) if fast else [*reader.feed(chunk)]
        except MqttError as exc:
            return seen, f"{exc.reason}: {exc} {exc.code}"
        for item in items:
            if isinstance(item, int):
                seen.append(PubAck(item))
            elif isinstance(item, tuple):
                topic, payload, qos, retain, dup, packet_id = item
                assert type(retain) is bool
                assert type(dup) is bool
                seen.append(Publish(topic, payload, qos, retain, dup, packet_id))
            else:
                seen.append(item)
    error = reader.error
    return seen, "" if error is None else f"{error.reason}: {error} {error.code}"


@given(
    st.sampled_from([V311, V5]).flatmap(
        lambda level: st.tuples(st.just(level), st.lists(packets(level), max_size=12))
    ),
    st.lists(st.integers(0, 2000), max_size=6),
)
@example((V311, [encode(Publish("a/b", b"x", 1, packet_id=7), V311), b"\x40\x02\x00\x07"]), [])
@example((V5, [encode(Publish("a", b"x", 1, packet_id=1, properties={Prop.TOPIC_ALIAS: 1}), V5)]), [])
@example((V311, [b"\x32\x07\x00\x01\x00\x00\x01zz"]), [3])  # a topic holding U+0000
@example((V311, [b"\x32\x06\x00\x02\xed\xa0\x00\x01"]), [])  # a surrogate: not UTF-8
@example((V311, [b"\x38\x04\x00\x01az"]), [])  # DUP at QoS 0
@example((V311, [b"\x42\x02\x00\x01"]), [])  # a PUBACK with flags
@example((V311, [b"\x32\x05\x00\x01a\x00\x00"]), [])  # packet identifier 0
@example((V311, [b"\x40\x02\x00\x00"]), [])  # likewise
@example((V311, [encode(Publish("a", bytes(MAX_PACKET)), V311)]), [])  # past the limit
def test_c_reads_what_python_reads(stream: tuple[int, list[bytes]], cuts: list[int]) -> None:
    level, parts = stream
    data = b"".join(parts)  # after the CONNECT's read (C reads a connected client's bytes)
    points = sorted({min(cut, len(data)) for cut in cuts})
    chunks = [encode(Connect(level, "c"), level)]
    chunks += [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    reference = run(MqttReader(MAX_PACKET), chunks, fast=False)
    assert run(MqttReader(MAX_PACKET), chunks, fast=True) == reference


def test_c_takes_plain_publishes_and_pubacks_as_fields() -> None:
    """The path is taken (not only agreed with): C's items are tuples and identifiers."""
    reader = MqttReader()
    reader.feed(encode(Connect(V311, "c"), V311))
    data = encode(Publish("a/b", b"hi", 1, True, False, 9), V311) + b"\x40\x02\x00\x05"
    data += encode(PingReq(), V311)
    assert reader.feed_fast(data) == [("a/b", b"hi", 1, True, False, 9), 5, PingReq()]


@given(
    st.text(max_size=30),
    st.binary(max_size=300),
    st.integers(0, 1),
    st.booleans(),
    st.booleans(),
    st.integers(1, 0xFFFF),
    st.sampled_from([V311, V5]),
)
def test_c_encodes_a_publish_as_python_does(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int, level: int
) -> None:
    args = (topic, payload, qos, retain, dup and bool(qos), packet_id if qos else 0, level)
    assert publish_bytes is not encode_publish
    assert publish_bytes(*args) == encode_publish(*args)
