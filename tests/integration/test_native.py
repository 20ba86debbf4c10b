"""The compiled hot paths (``_native``) against the Python codec, ZeroMQ over real sockets.

The receive loop only takes the path where nothing is wrong and hands everything else back as frames;
so for any mix of messages, good, damaged or foreign, what it returns (decoded by ``decode_frames`` where
it handed frames back) must be exactly what the Python decoders make of the messages as sent; the same
for the NATS decoder. The sender must put on the wire, byte for byte, what the Python encoder sends for
the same envelope.
"""

from __future__ import annotations

import contextlib
import errno
import struct
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.batches import BATCH_BYTES, batch_topic, decode_batch
from meshplane.core.envelope import Codec, EventEnvelope, msgpack_envelope_decoder
from meshplane.core.framing import (
    HEARTBEAT_SUFFIX,
    MessageType,
    WireFormat,
    ZmqEncoder,
    as_frame,
    decode_zmq,
    encode_nats,
)
from meshplane.errors import WireError
from meshplane.transports.inbox import decode_messages
from meshplane.transports.native import (
    ExpectedEnvelope,
    NativeReceive,
    expected_envelope,
    native_nats_decode,
    native_receive,
    native_sender,
)
from meshplane.transports.zmq_messages import decode_frames

TOPIC = b"kv"
u64 = st.integers(min_value=0, max_value=2**64 - 1)


def _compiled() -> NativeReceive:
    receive = native_receive()
    assert receive is not None, "the C extension was not built: `pip install -e .` needs a C compiler"
    return receive


def test_the_extension_is_built_and_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert native_receive() is not None
    assert native_nats_decode() is not None
    with socket_pair() as (pub, _):
        assert native_sender(pub, TOPIC, 1, "kv", WireFormat.HEADER8, Codec.MSGPACK) is not None
        assert native_sender(pub, TOPIC, 1, "kv", WireFormat.HEADER8, Codec.JSON) is None
        monkeypatch.setenv("MESHPLANE_NO_EXTENSIONS", "1")
        assert native_receive() is None
        assert native_nats_decode() is None
        assert native_sender(pub, TOPIC, 1, "kv", WireFormat.HEADER8, Codec.MSGPACK) is None


@contextlib.contextmanager
def socket_pair(inproc: bool = False) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """A connected PUB and SUB, over TCP, or in-process (where a message sent is at once receivable)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: foreign ones too must come back as frames
    if inproc:
        pub.bind("inproc://native")
        sub.connect("inproc://native")
    else:
        sub.connect(f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}")
    deadline = time.monotonic() + 10
    while True:  # until the subscription has reached the publisher
        pub.send(b"probe")
        if sub.poll(50):
            sub.recv()
            while sub.poll(50):
                sub.recv()
            break
        assert time.monotonic() < deadline, "the sockets never connected"
    try:
        yield pub, sub
    finally:
        pub.close(0)
        sub.close(0)
        ctx.term()


def _header8(pid: int, seq: int, topic: str, payload: bytes, heartbeat: bool) -> list[bytes]:
    envelope = EventEnvelope(pid, seq, 1769000000000, topic, payload)
    kind = MessageType.HEARTBEAT if heartbeat else MessageType.EVENT
    return [TOPIC, encode_nats(envelope, WireFormat.HEADER8, message_type=kind)]


def _dynamo(pid: int, seq: int, topic: str, payload: bytes, frame_pid: int | None) -> list[bytes]:
    body: bytes = msgpack.packb(
        {"publisher_id": pid, "sequence": seq, "published_at": 1, "topic": topic, "payload": payload},
        use_bin_type=True,
    )
    pid_frame = struct.pack(">Q", pid if frame_pid is None else frame_pid)
    return [TOPIC, pid_frame, struct.pack(">Q", seq), struct.pack(">BI", 1, len(body)) + body]


topics = st.sampled_from(["kv", "kv-events", "kv" + HEARTBEAT_SUFFIX, "", "ké"])
payloads = st.binary(max_size=200)


def _sized(fixed: int | None, first_sized: int, length: int, width: int) -> bytes:
    """A str or bin header of ``length``: the fix form (when ``fixed`` is given and width is 0), or the
    sized form with a length of 1, 2 or 4 bytes (types first_sized, + 1, + 2)."""
    if width == 0 and fixed is not None and length < 32:
        return bytes([fixed | length])
    width = max(width, 1)
    if length >= 1 << (8 * width):
        width = 4 if length >= 1 << 16 else 2
    return bytes([first_sized + {1: 0, 2: 1, 4: 2}[width]]) + length.to_bytes(width, "big")


def _uint(value: int, how: str) -> bytes:
    """``value`` in any MessagePack integer form that holds it: the smallest unsigned, a wider unsigned, or
    a signed one (which msgspec reads as the same int)."""
    if how == "smallest" or value >= 2**63:
        return msgpack.packb(value)  # type: ignore[no-any-return]
    if how == "uint64":
        return b"\xcf" + value.to_bytes(8, "big")
    return b"\xd3" + value.to_bytes(8, "big", signed=True)


@st.composite
def envelope_bodies(draw: st.DrawFn, pid: int, seq: int, topic: str, payload: bytes) -> bytes:
    """An envelope map as any MessagePack writer may lay it out: mostly msgspec's own layout, else keys
    reordered, integers, str and bin in other widths, an extra field or bytes after the map."""
    ints = st.sampled_from(["smallest"] * 6 + ["uint64", "int64"])
    widths = st.sampled_from([0] * 6 + [1, 2, 4])
    text = topic.encode()
    fields = [
        (b"publisher_id", _uint(pid, draw(ints))),
        (b"sequence", _uint(seq, draw(ints))),
        (b"published_at", _uint(1769000000000, draw(ints))),
        (b"topic", _sized(0xA0, 0xD9, len(text), draw(widths)) + text),
        (b"payload", _sized(None, 0xC4, len(payload), draw(widths)) + payload),
    ]
    if draw(st.integers(0, 9)) == 0:
        fields.append((b"extra", b"\xc0"))
    if draw(st.integers(0, 9)) == 0:
        fields = draw(st.permutations(fields))
    body = bytes([0x80 | len(fields)]) + b"".join(bytes([0xA0 | len(k)]) + k + v for k, v in fields)
    return body + (b"\x00" if draw(st.integers(0, 19)) == 0 else b"")


@st.composite
def laid_out(draw: st.DrawFn) -> list[bytes]:
    """An event of either layout whose body is any layout of the envelope map."""
    pid, seq, topic, payload = draw(u64), draw(u64), draw(topics), draw(payloads)
    body = draw(envelope_bodies(pid, seq, topic, payload))
    if draw(st.booleans()):
        return [TOPIC, struct.pack(">BBBBI", 2, 0, 0, 0, len(body)) + body]
    head = struct.pack(">Q", pid) + struct.pack(">Q", seq)
    return [TOPIC, head[:8], head[8:], struct.pack(">BI", 1, len(body)) + body]


good_messages = st.one_of(
    st.builds(_header8, u64, u64, topics, payloads, st.booleans()),
    st.builds(_dynamo, u64, u64, topics, payloads, st.none() | u64),
    laid_out(),
)


@st.composite
def damaged(draw: st.DrawFn) -> list[bytes]:
    frames = [bytearray(f) for f in draw(good_messages)]
    how = draw(st.sampled_from(["flip", "truncate", "extend", "add frame", "drop frame", "frame0"]))
    index = draw(st.integers(0, len(frames) - 1))
    frame = frames[index]
    if how == "flip" and frame:
        frame[draw(st.integers(0, len(frame) - 1))] ^= draw(st.integers(1, 255))
    elif how == "truncate":
        del frame[draw(st.integers(0, len(frame))) :]
    elif how == "extend":
        frame += draw(st.binary(min_size=1, max_size=4))
    elif how == "add frame":
        frames.insert(index, bytearray(draw(st.binary(max_size=8))))
    elif how == "drop frame" and len(frames) > 1:
        del frames[index]
    elif how == "frame0":
        frames[0] = bytearray(draw(st.sampled_from([b"k", b"kv-events", b"KV", b""])))
    return [bytes(f) for f in frames]


messages = st.one_of(good_messages, damaged(), st.lists(st.binary(max_size=12), min_size=1, max_size=6))


def _outcome(item: Any) -> Any:
    """What the intake would make of a received item: a Frame, or the error's kind and message."""
    if isinstance(item, WireError):
        return (type(item).__name__, str(item))
    return as_frame(item, TOPIC)


def _check_run(out: list[Any], run: tuple[int, int] | None, topic: str) -> None:
    """A run the receive claims is true: every item an envelope of ``topic``, one publisher's, in sequence."""
    if run is not None:
        publisher, first = run
        assert [(type(e), e.publisher_id, e.sequence, e.topic) for e in out] == [
            (EventEnvelope, publisher, first + i, topic) for i in range(len(out))
        ]


def _drain(
    receive: NativeReceive,
    sub: zmq.Socket[bytes],
    expected: int,
    max_bytes: int,
    batch: int,
    expected_topic: ExpectedEnvelope | None = None,
    runs: list[tuple[int, int] | None] | None = None,
) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while len(got) < expected:
        out: list[Any] = []
        decode = msgpack_envelope_decoder.decode
        unusual, error, run = receive(
            sub.underlying, TOPIC, max_bytes, batch, decode, out, expected_topic, None
        )
        assert len(out) <= batch
        assert unusual == sum(type(item) is list for item in out)
        assert error == (0 if len(out) == batch else errno.EAGAIN)
        if expected_topic is None:
            assert run is None  # nothing is read without the decoder, so nothing is vouched for
        else:
            _check_run(out, run, expected_topic[1])
        if out and runs is not None:
            runs.append(run)
        got += out
        if not out:
            assert time.monotonic() < deadline, f"{len(got)} of {expected} messages arrived"
            sub.poll(10)
    return got


@pytest.mark.parametrize("expected_topic", [None, "kv", "ké"])
def test_compiled_receive_decides_every_message_as_the_python_decoders_do(expected_topic: str | None) -> None:
    """With or without an expected topic (whose events C reads without the decoder when laid out as
    msgspec lays them out), for any mix of messages and any layout of the envelope map."""
    receive = _compiled()
    expected_envelope_of = None if expected_topic is None else expected_envelope(expected_topic)
    with socket_pair() as (pub, sub):

        @settings(max_examples=300, deadline=None)
        @given(st.lists(messages, min_size=1, max_size=12), st.integers(8, 300), st.integers(1, 5))
        def check(sent: list[list[bytes]], max_bytes: int, batch: int) -> None:
            for frames in sent:
                pub.send_multipart(frames)
            got = _drain(receive, sub, len(sent), max_bytes, batch, expected_envelope_of)
            for frames, item in zip(sent, got, strict=True):
                expected = decode_frames(frames, TOPIC, max_bytes)
                if type(item) is list:
                    assert item == frames  # handed back whole
                    item = decode_frames(item, TOPIC, max_bytes)
                else:  # decoded in C: only ever a good event under our own topic
                    assert isinstance(item, EventEnvelope)
                    assert isinstance(expected, EventEnvelope)
                assert _outcome(item) == _outcome(expected)

        check()


def test_compiled_receive_takes_the_common_shapes_itself() -> None:
    """Good events under the subscriber's topic come back decoded, not as frames (else the C loop would
    be correct but useless); heartbeats, foreign topics and oversized bodies come back as frames."""
    receive = _compiled()
    with socket_pair() as (pub, sub):
        common = [_header8(7, 1, "kv", b"a", False), _dynamo(7, 2, "kv", b"b", None)]
        unusual = [
            _header8(7, 3, "kv", b"c", True),  # heartbeat
            _dynamo(7, 4, "kv" + HEARTBEAT_SUFFIX, b"d", None),  # Dynamo heartbeat
            _dynamo(7, 5, "kv", b"e", 8),  # publisher id frame disagrees
            [b"kv-events", _header8(7, 6, "kv", b"f", False)[1]],  # another topic
            _header8(7, 7, "kv", b"g" * 500, False),  # over max_bytes
        ]
        for frames in common + unusual:
            pub.send_multipart(frames)
        runs: list[tuple[int, int] | None] = []
        got = _drain(receive, sub, len(common) + len(unusual), 300, 100, expected_envelope("kv"), runs)
        assert [(e.sequence, e.payload) for e in got[:2]] == [(1, b"a"), (2, b"b")]
        assert got[2:] == unusual
        # The messages may come in more than one batch (each claim was checked by _drain); the one with
        # the unusual frames is never a run.
        assert runs[-1] is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([7, 8]), st.integers(0, 3)), min_size=1, max_size=30))
def test_compiled_receive_reports_a_batch_of_consecutive_events_as_a_run(
    steps: list[tuple[int, int]],
) -> None:
    """Events of one topic from publishers 7 and 8, each step a publisher and how far its sequence
    jumps: a batch is a run exactly when it is one publisher's consecutive events, and the claim is
    checked against the envelopes (``_check_run``)."""
    receive = _compiled()
    next_sequence = {7: 0, 8: 2**64 - 3}  # 8 reaches the end of the sequence space
    sent: list[tuple[int, int]] = []
    for publisher, jump in steps:
        sequence = (next_sequence[publisher] + jump) % 2**64
        sent.append((publisher, sequence))
        next_sequence[publisher] = (sequence + 1) % 2**64
    with socket_pair(inproc=True) as (pub, sub):  # all in one batch
        for publisher, sequence in sent:
            pub.send_multipart(_header8(publisher, sequence, "kv", b"x", False))
        runs: list[tuple[int, int] | None] = []
        _drain(receive, sub, len(sent), 300, len(sent), expected_envelope("kv"), runs)
    one_run = all(p == sent[0][0] for p, _ in sent) and all(
        s == sent[0][1] + i for i, (_, s) in enumerate(sent)
    )
    assert runs == [sent[0] if one_run else None]


payload_lengths = st.sampled_from([0, 1, 127, 255, 256, 65535, 65536, 70000])


def test_compiled_sender_sends_what_the_python_encoder_sends() -> None:
    """Every integer width of publisher id, sequence and clock, every bin and str length class, both
    layouts, any routing topic: the frames equal ``ZmqEncoder``'s for the envelope that was sent, and
    its ``published_at`` is the clock at the call."""
    with socket_pair() as (pub, sub):

        @settings(max_examples=300, deadline=None)
        @given(
            u64,
            u64,
            st.text(max_size=300),
            st.binary(max_size=300) | payload_lengths.map(bytes),
            st.sampled_from(WireFormat),
            st.binary(min_size=1, max_size=40),
        )
        def check(pid: int, seq: int, topic: str, payload: bytes, wire: WireFormat, routing: bytes) -> None:
            senders = native_sender(pub, routing, pid, topic, wire, Codec.MSGPACK)
            assert senders is not None
            before = time.time_ns() // 1_000_000
            assert senders.one(seq, payload) == 0
            after = time.time_ns() // 1_000_000
            assert sub.poll(10_000)
            frames = sub.recv_multipart()
            envelope = decode_zmq(frames).envelope
            assert before <= envelope.published_at <= after
            expected = EventEnvelope(pid, seq, envelope.published_at, topic, payload)
            assert frames == ZmqEncoder(routing, pid, wire, Codec.MSGPACK).encode(expected)

        check()


def test_compiled_batch_sender_sends_the_list_from_start_as_one_by_one_sends_would() -> None:
    """``send_events``: payloads[start:], payloads[i] as sequence first + i, each message the frames
    ``ZmqEncoder`` makes for its envelope; (sent, 0) when all went."""
    with socket_pair() as (pub, sub):

        @settings(max_examples=100, deadline=None)
        @given(
            u64,
            st.integers(0, 2**63),
            st.lists(st.binary(max_size=300) | payload_lengths.map(bytes), max_size=8),
            st.integers(0, 8),
            st.sampled_from(WireFormat),
        )
        def check(pid: int, first: int, payloads: list[bytes], start: int, wire: WireFormat) -> None:
            start = min(start, len(payloads))
            senders = native_sender(pub, b"kv", pid, "kv", wire, Codec.MSGPACK)
            assert senders is not None
            assert senders.many(first, payloads, start) == (len(payloads) - start, 0)
            encoder = ZmqEncoder(b"kv", pid, wire, Codec.MSGPACK)
            for i in range(start, len(payloads)):
                assert sub.poll(10_000)
                frames = sub.recv_multipart()
                at = decode_zmq(frames).envelope.published_at
                assert frames == encoder.encode(EventEnvelope(pid, first + i, at, "kv", payloads[i]))
            assert not sub.poll(0)

        check()


@pytest.mark.parametrize("kind", ["many", "batches"])
def test_compiled_list_senders_refuse_bad_arguments_before_sending_anything(kind: str) -> None:
    with socket_pair() as (pub, sub):
        senders = native_sender(pub, b"kv", 1, "kv", WireFormat.HEADER8, Codec.MSGPACK)
        assert senders is not None

        def send(payloads: list[Any], start: int) -> tuple[int, int]:
            if kind == "many":
                return senders.many(0, payloads, start)
            return senders.batches(0, payloads, start, BATCH_BYTES)

        with pytest.raises(IndexError, match="start is outside the payloads"):
            send([b"a"], 2)
        with pytest.raises(TypeError, match="every payload must be bytes"):
            send([b"a", "not bytes"], 0)
        assert not sub.poll(100)  # nothing of either list went


def test_compiled_batch_sender_stops_at_a_full_queue_with_nothing_of_that_event_sent() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub, sub = ctx.socket(zmq.XPUB), ctx.socket(zmq.SUB)
    pub.setsockopt(zmq.SNDHWM, 2)
    pub.setsockopt(zmq.XPUB_NODROP, 1)  # as MESHPLANE_SEND_WHEN_FULL=wait: refuse, never drop
    sub.setsockopt(zmq.RCVHWM, 2)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}")
    try:
        assert pub.poll(10_000)
        assert pub.recv() == b"\x01kv"  # subscribed
        senders = native_sender(pub, b"kv", 1, "kv", WireFormat.HEADER8, Codec.MSGPACK)
        assert senders is not None
        payloads = [b"x" * 100_000] * 200  # more than the socket buffers and both queues hold
        sent, refused = senders.many(0, payloads, 0)
        assert refused == errno.EAGAIN
        assert 0 < sent < len(payloads)
        received = 0
        while sub.poll(1000):
            frames = sub.recv_multipart()  # whole messages only: the refused one left nothing behind
            assert decode_zmq(frames).envelope.sequence == received
            received += 1
        assert received == sent
    finally:
        pub.close(linger=0)
        sub.close(linger=0)
        ctx.term()


BATCH = batch_topic(TOPIC)
END = [b"end of the example"]  # a message of one frame that no strategy here makes


@st.composite
def batch_messages(draw: st.DrawFn) -> list[bytes]:
    """A batch message: good events in the 8-byte-header layout back to back, or with one damaged, a
    heartbeat, an item of another layout, a bad length, bytes left over, or nothing at all."""
    items = [
        _header8(draw(st.sampled_from([7, 8])), draw(u64), draw(topics), draw(payloads), False)[1]
        for _ in range(draw(st.integers(1, 6)))
    ]
    how = draw(st.sampled_from(["good"] * 4 + ["damaged", "heartbeat", "dynamo", "length", "tail", "empty"]))
    index = draw(st.integers(0, len(items) - 1))
    if how == "damaged":
        items[index] = draw(damaged().filter(lambda frames: len(frames) == 2))[1]
    elif how == "heartbeat":
        items[index] = _header8(7, 1, "kv", b"h", True)[1]
    elif how == "dynamo":
        items[index] = _dynamo(7, 1, "kv", b"d", None)[3]
    elif how == "length":
        item = bytearray(items[index])
        item[4:8] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
        items[index] = bytes(item)
    elif how == "tail":
        items.append(draw(st.binary(min_size=1, max_size=12)))
    elif how == "empty":
        items = []
    return [BATCH, b"".join(items)]


def test_compiled_receive_reads_batch_messages_as_decode_batch_does() -> None:
    """Batch messages among ordinary ones: a batch comes back as its events (every item a common event)
    or as its frames, and either way what it holds is what ``decode_batch`` makes of it; the run claim
    holds across batches."""
    receive = _compiled()
    with socket_pair() as (pub, sub):

        @settings(max_examples=300, deadline=None)
        @given(st.lists(batch_messages() | messages, min_size=1, max_size=8), st.integers(8, 300))
        def check(sent: list[list[bytes]], max_bytes: int) -> None:
            for frames in sent:
                pub.send_multipart(frames)
            pub.send_multipart(END)  # once it is read, so is everything sent before it
            got: list[Any] = []
            deadline = time.monotonic() + 10
            expected = [
                decode_batch(f[1], TOPIC, max_bytes) if f[0] == BATCH and len(f) == 2 else [f] for f in sent
            ]
            while not got or got[-1] != END:
                out: list[Any] = []
                unusual, _, run = receive(
                    sub.underlying, TOPIC, max_bytes, 4, msgpack_envelope_decoder.decode, out, None, BATCH
                )
                assert len(out) < 4 + 1024  # bounded: one batch past max_messages at most
                assert unusual == sum(type(item) is list for item in out)
                assert run is None  # nothing read without the decoder is vouched for
                got += out
                if not out:
                    assert time.monotonic() < deadline, f"{len(got)} items, no end marker"
                    sub.poll(10)
            got.pop()
            for frames, decoded in zip(sent, expected, strict=True):
                if frames[0] == BATCH and len(frames) == 2:
                    if got and got[0] == frames:  # handed back whole
                        got.pop(0)
                        continue
                    mine, got = got[: len(decoded)], got[len(decoded) :]
                    assert all(isinstance(item, EventEnvelope) for item in mine)
                    assert [_outcome(item) for item in mine] == [_outcome(item) for item in decoded]
                else:
                    item = got.pop(0)
                    item = decode_frames(item, TOPIC, max_bytes) if type(item) is list else item
                    assert _outcome(item) == _outcome(decode_frames(frames, TOPIC, max_bytes))
            assert got == []

        check()


def test_compiled_receive_reports_a_run_across_batch_messages() -> None:
    receive = _compiled()
    with socket_pair(inproc=True) as (pub, sub):
        items = [_header8(7, sequence, "kv", b"x", False)[1] for sequence in range(10)]
        pub.send_multipart([BATCH, b"".join(items[:4])])
        pub.send_multipart(_header8(7, 4, "kv", b"x", False))
        pub.send_multipart([BATCH, b"".join(items[5:])])
        out: list[Any] = []
        unusual, _, run = receive(
            sub.underlying,
            TOPIC,
            300,
            100,
            msgpack_envelope_decoder.decode,
            out,
            expected_envelope("kv"),
            BATCH,
        )
        assert (unusual, run) == (0, (7, 0))
        assert [e.sequence for e in out] == list(range(10))
        pub.send_multipart([BATCH, b"".join([items[0], _header8(8, 1, "kv", b"x", False)[1]])])
        out = []
        unusual, _, run = receive(
            sub.underlying,
            TOPIC,
            300,
            100,
            msgpack_envelope_decoder.decode,
            out,
            expected_envelope("kv"),
            BATCH,
        )
        assert (unusual, run, len(out)) == (0, None, 2)  # two publishers: no run


def test_compiled_sender_sends_batches_whose_items_are_the_events_one_by_one_sends_would_carry() -> None:
    """``send_batches``: payloads[start:] as batch messages of at most BATCH_BYTES (one event at least),
    each item the 8-byte-header frame ``ZmqEncoder`` makes for its envelope, in order."""
    with socket_pair() as (pub, sub):

        @settings(max_examples=100, deadline=None)
        @given(
            u64,
            st.integers(0, 2**63),
            st.lists(st.binary(max_size=3000) | payload_lengths.map(bytes), max_size=40),
            st.integers(0, 8),
            st.sampled_from(WireFormat),
        )
        def check(pid: int, first: int, payloads: list[bytes], start: int, wire: WireFormat) -> None:
            start = min(start, len(payloads))
            senders = native_sender(pub, b"kv", pid, "kv", wire, Codec.MSGPACK)
            assert senders is not None
            assert senders.batches(first, payloads, start, BATCH_BYTES) == (len(payloads) - start, 0)
            encoder = ZmqEncoder(b"kv", pid, WireFormat.HEADER8, Codec.MSGPACK)
            got: list[EventEnvelope] = []
            while len(got) < len(payloads) - start:
                assert sub.poll(10_000)
                frames = sub.recv_multipart()
                assert (frames[0], len(frames)) == (BATCH, 2)
                events = decode_batch(frames[1], b"kv", 2**20)
                assert len(frames[1]) <= BATCH_BYTES or len(events) == 1
                for event in events:
                    assert isinstance(event, EventEnvelope)
                    assert frames[1].count(encoder.encode(event)[1]) >= 1  # the item, byte for byte
                got += events  # type: ignore[arg-type]
            assert not sub.poll(0)
            assert [(e.publisher_id, e.sequence, e.topic, e.payload) for e in got] == [
                (pid, first + i, "kv", payloads[i]) for i in range(start, len(payloads))
            ]

        check()


# NATS message data: what the frames above carry in their last frame, the bare Dynamo envelope, or noise
nats_messages = st.one_of(
    messages.map(lambda frames: frames[-1]),
    st.builds(_dynamo, u64, u64, topics, payloads, st.none()).map(lambda frames: frames[3][5:]),
    st.binary(max_size=40),
)


@settings(max_examples=500)
@given(st.lists(nats_messages, max_size=12), st.integers(0, 300), st.sampled_from([None, "kv", "ké"]))
def test_compiled_nats_decoder_decides_every_message_as_the_python_decoder_does(
    batch: list[bytes], max_bytes: int, expected_topic: str | None
) -> None:
    """With or without an expected topic, whose events C reads without the decoder and vouches for as
    runs (each claim checked)."""
    compiled = native_nats_decode()
    assert compiled is not None
    expected_of = None if expected_topic is None else expected_envelope(expected_topic)
    got, run = decode_messages(batch, TOPIC, max_bytes, compiled, expected_of)
    expected, no_run = decode_messages(batch, TOPIC, max_bytes)
    assert [_outcome(item) for item in got] == [_outcome(item) for item in expected]
    assert no_run is None
    if expected_topic is None:
        assert run is None
    else:
        _check_run(got, run, expected_topic)


def test_compiled_nats_decoder_reports_one_publishers_consecutive_events_as_a_run() -> None:
    compiled = native_nats_decode()
    assert compiled is not None
    dynamo = [_dynamo(7, sequence, "kv", b"a", None)[3][5:] for sequence in range(3)]
    header8 = [_header8(7, sequence, "kv", b"b", False)[1] for sequence in range(3, 5)]
    expected = expected_envelope("kv")
    got, run = decode_messages([*dynamo, *header8], TOPIC, 300, compiled, expected)
    assert (run, [e.sequence for e in got if isinstance(e, EventEnvelope)]) == ((7, 0), [0, 1, 2, 3, 4])
    heartbeat = _header8(7, 5, "kv", b"", True)[1]
    assert decode_messages([*dynamo, heartbeat], TOPIC, 300, compiled, expected)[1] is None
    other = _dynamo(8, 3, "kv", b"a", None)[3][5:]
    assert decode_messages([*dynamo, other], TOPIC, 300, compiled, expected)[1] is None


def test_compiled_nats_decoder_takes_the_common_events_itself() -> None:
    compiled = native_nats_decode()
    assert compiled is not None
    dynamo = _dynamo(7, 1, "kv", b"a", None)[3][5:]
    header8 = _header8(7, 2, "kv", b"b", False)[1]
    unusual = [
        _dynamo(7, 3, "kv" + HEARTBEAT_SUFFIX, b"c", None)[3][5:],  # a Dynamo heartbeat
        _header8(7, 4, "kv", b"d", True)[1],  # a version-2 heartbeat
        _dynamo(7, 5, "kv", b"e" * 400, None)[3][5:],  # over max_bytes
        b"\x00garbage",
    ]
    out: list[Any] = []
    decode = msgpack_envelope_decoder.decode
    assert compiled([dynamo, header8, *unusual], 300, decode, out, expected_envelope("kv")) == (
        len(unusual),
        None,
    )
    assert [(e.sequence, e.payload) for e in out[:2]] == [(1, b"a"), (2, b"b")]
    assert all(item is data for item, data in zip(out[2:], unusual, strict=True))
