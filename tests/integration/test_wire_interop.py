"""Byte-level interoperability with Dynamo 1.6.1's wire, using plain pyzmq / nats-py / msgpack as the peer.

The peer's frames are built by hand here (struct + msgpack), never with meshplane's encoder, so a
mistake in meshplane's codec cannot hide behind the same mistake on the other side.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import nats
import pytest
import zmq
import zmq.asyncio

from meshplane import Codec, EventEnvelope, EventPlane, PlaneConfig, Scope, WireFormat
from meshplane.core.framing import encode_nats
from meshplane.launchers import NatsServer
from meshplane.transports.native import native_receive
from meshplane.transports.nats import NatsSubscriberTransport, flush_in_order
from tests.conftest import make_config
from tests.helpers import eventually

SCOPE = Scope.endpoint("interop", "worker", "generate")


def dynamo_envelope(pid: int, seq: int, topic: str, payload: bytes) -> bytes:
    data: bytes = msgpack.packb(
        {
            "publisher_id": pid,
            "sequence": seq,
            "published_at": int(time.time() * 1000),
            "topic": topic,
            "payload": payload,
        },
        use_bin_type=True,
    )
    return data


def dynamo_frames(pid: int, seq: int, topic: str, payload: bytes, frame0: str | None = None) -> list[bytes]:
    envelope = dynamo_envelope(pid, seq, topic, payload)
    return [
        (frame0 or topic).encode(),
        struct.pack(">Q", pid),
        struct.pack(">Q", seq),
        struct.pack(">BI", 1, len(envelope)) + envelope,
    ]


def write_dynamo_record(kv: Path, topic: str, pid: int, endpoint: str) -> None:
    """What Dynamo's file backend writes for a ZMQ publisher (the spec's layout, built by hand)."""
    rest = f"namespace/interop/component/worker/endpoint/generate/topic/{topic}/{pid:x}"
    name = "".join(c if c.isascii() and c.isalnum() else f"%{ord(c):02X}" for c in rest)
    record = {
        "type": "EventChannel",
        "scope": {
            "kind": "endpoint",
            "endpoint": {"namespace": "interop", "component": "worker", "name": "generate"},
        },
        "topic": topic,
        "instance_id": pid,
        "transport": {"kind": "Zmq", "config": {"endpoint": endpoint}},
    }
    folder = kv / "v1" / "event_channels"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(record))


@pytest.fixture
def zmq_config(tmp_path: Path) -> PlaneConfig:
    return make_config("zmq", "file", tmp_path, None, None)


@pytest.fixture(params=["compiled", "pyzmq"])
def receive_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ZeroMQ receive loops: the C one (the default where it is built) and pyzmq's."""
    if request.param == "pyzmq":
        monkeypatch.setenv("MESHPLANE_NO_EXTENSIONS", "1")
    else:
        assert native_receive() is not None, "the C extension was not built"
    return str(request.param)


@pytest.fixture
async def raw_xpub() -> AsyncIterator[tuple[zmq.asyncio.Socket, str]]:
    """A plain socket standing in for a Dynamo publisher (an XPUB: a PUB that reports subscriptions)."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.bind("tcp://127.0.0.1:*")
    yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.close(0)
    ctx.term()


async def test_meshplane_zmq_publisher_speaks_dynamo_frames(zmq_config: PlaneConfig) -> None:
    async with EventPlane(zmq_config) as plane:
        pub = await plane.publisher(SCOPE, "kv_metrics")
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv_metrics")
        assert pub.channel is not None
        sub.connect(pub.channel.zmq_endpoint or "")
        await pub.wait_for_subscribers(1, 10)
        await pub.publish(b"payload-0")
        await pub.publish({"k": 1})
        frames = [await asyncio.wait_for(sub.recv_multipart(), 10) for _ in range(2)]
        sub.close(0)
        ctx.term()
    for seq, (topic, pid, seq_frame, last) in enumerate(frames):
        assert topic == b"kv_metrics"
        assert struct.unpack(">Q", pid)[0] == pub.publisher_id
        assert struct.unpack(">Q", seq_frame)[0] == seq
        version, length = struct.unpack(">BI", last[:5])
        assert (version, length) == (1, len(last) - 5)
        envelope = msgpack.unpackb(last[5:])
        assert list(envelope) == ["publisher_id", "sequence", "published_at", "topic", "payload"]
        assert envelope["topic"] == "kv_metrics"
        assert abs(envelope["published_at"] - time.time() * 1000) < 60_000
    assert msgpack.unpackb(frames[0][3][5:])["payload"] == b"payload-0"
    assert msgpack.unpackb(msgpack.unpackb(frames[1][3][5:])["payload"]) == {"k": 1}


async def subscribed(sock: zmq.asyncio.Socket) -> None:
    """Until the subscription to ``kv`` arrived (a compiled subscriber subscribes to batch messages too,
    ``\x00kv``, which a Dynamo publisher never sends: nothing of it matches ``kv``)."""
    while (subscription := await asyncio.wait_for(sock.recv(), 10)) != b"\x01kv":
        assert subscription == b"\x01\x00kv"


async def test_meshplane_subscriber_consumes_a_dynamo_publisher_and_survives_garbage(
    zmq_config: PlaneConfig, raw_xpub: tuple[zmq.asyncio.Socket, str], receive_path: str
) -> None:
    sock, endpoint = raw_xpub
    pid = 0x0007D4878FD52789
    write_dynamo_record(zmq_config.file_kv, "kv", pid, endpoint)
    async with EventPlane(zmq_config.replace(max_message_bytes=10_000)) as plane:
        sub = await plane.subscriber(SCOPE, "kv")
        await subscribed(sock)
        good = dynamo_frames(pid, 0, "kv", b"first")
        bad: list[list[bytes]] = [
            [b"kv", good[3]],  # 2 frames (the seed layout) carrying a version-1 header
            good[:3],  # 3 frames
            [*good[:3], good[3][:-3]],  # truncated envelope
            [*good[:3], b"\x02" + good[3][1:]],  # header version 2 in the 4-frame layout
            # oversized (a little: read and counted; twice the limit and more: libzmq drops the peer)
            [*good[:3], struct.pack(">BI", 1, 15_000) + b"x" * 15_000],
            [*good[:3], struct.pack(">BI", 1, 3) + b"\xc1\xc1\xc1"],  # not msgpack
            dynamo_frames(pid, 1, "kv-events", b"other topic"),  # prefix match, wrong topic
            dynamo_frames(pid, 1, "kv", b"envelope says kv", frame0="kv-x"),  # frame0 disagrees
        ]
        for frames in [good, *bad, dynamo_frames(pid, 1, "kv", b"second")]:
            await sock.send_multipart(frames)
        first, second = await sub.next(10), await sub.next(10)
        assert (first.publisher_id, first.sequence, first.payload) == (pid, 0, b"first")
        assert (second.sequence, second.payload) == (1, b"second")
        stats = sub.stats
        assert stats.received == 2
        assert stats.filtered == 2
        assert dict(stats.malformed) == {
            "frame_count": 1,
            "truncated": 1,
            "version": 2,
            "oversized": 1,
            "malformed": 1,
        }
        # Nothing else came through: the next event to arrive is one sent after all of the above.
        await sock.send_multipart(dynamo_frames(pid, 2, "kv", b"marker"))
        assert (await sub.next(10)).payload == b"marker"


async def test_header8_garbage_costs_no_good_event_around_it(
    zmq_config: PlaneConfig, raw_xpub: tuple[zmq.asyncio.Socket, str], receive_path: str
) -> None:
    """The 8-byte-header fast path (its own topic, two frames) still checks every frame boundary: a
    bad message is counted, and the good events before and after it arrive."""
    sock, endpoint = raw_xpub
    pid = 0x42
    write_dynamo_record(zmq_config.file_kv, "kv", pid, endpoint)

    def message(sequence: int, topic: str = "kv", frame0: bytes = b"kv") -> list[bytes]:
        envelope = EventEnvelope(pid, sequence, 0, topic, b"event %d" % sequence)
        return [frame0, encode_nats(envelope, WireFormat.HEADER8)]

    async with EventPlane(zmq_config.replace(max_message_bytes=10_000)) as plane:
        sub = await plane.subscriber(SCOPE, "kv")
        await subscribed(sock)
        good = message(0)
        flagged = bytearray(good[1])
        flagged[3] = 1
        bad: list[list[bytes]] = [
            [b"kv"],  # 1 frame
            [*good, b"extra"],  # 3 frames
            [b"kv", good[1][:-1]],  # truncated body
            [b"kv", bytes(flagged)],  # a flag set
            [b"kv", good[1][:8] + b"\xc1" * (len(good[1]) - 8)],  # not MessagePack
            message(1, topic="kv-events", frame0=b"kv-events"),  # prefix match, another topic
            message(1, frame0=b"kv-x"),  # frame0 disagrees with the envelope
        ]
        for frames in [good, *bad, message(1), message(2)]:
            await sock.send_multipart(frames)
        got = [await sub.next(10) for _ in range(3)]
        assert [(e.sequence, e.payload) for e in got] == [(0, b"event 0"), (1, b"event 1"), (2, b"event 2")]
        stats = sub.stats
        assert (stats.received, stats.filtered, stats.gaps) == (3, 2, 0)
        assert dict(stats.malformed) == {"frame_count": 2, "truncated": 1, "malformed": 2}
        await sock.send_multipart(message(3))  # nothing else came through: the next is this one
        assert (await sub.next(10)).sequence == 3


async def test_array_encoded_envelopes_are_accepted(
    zmq_config: PlaneConfig, raw_xpub: tuple[zmq.asyncio.Socket, str]
) -> None:
    sock, endpoint = raw_xpub
    write_dynamo_record(zmq_config.file_kv, "arr", 7, endpoint)
    async with EventPlane(zmq_config) as plane:
        sub = await plane.subscriber(SCOPE, "arr")
        await asyncio.wait_for(sock.recv(), 10)
        envelope = msgpack.packb([7, 0, 1, "arr", b"as array"], use_bin_type=True)
        await sock.send_multipart(
            [
                b"arr",
                struct.pack(">Q", 7),
                struct.pack(">Q", 0),
                struct.pack(">BI", 1, len(envelope)) + envelope,
            ]
        )
        assert (await sub.next(10)).payload == b"as array"


async def test_nats_wire_is_the_bare_envelope_both_ways(nats_server: NatsServer, tmp_path: Path) -> None:
    config = make_config("nats", "file", tmp_path, nats_server, None)
    subject = SCOPE.subject("kv-events")
    raw = await nats.connect(nats_server.url)
    try:
        raw_sub = await raw.subscribe(subject)
        await flush_in_order(raw, 5)
        async with EventPlane(config) as plane:
            sub = await plane.subscriber(SCOPE, "kv-events")
            pub = await plane.publisher(SCOPE, "kv-events")
            # meshplane -> plain nats-py: the data is the bare msgpack envelope, no header
            await pub.publish(b"hello")
            await pub.flush()
            msg = await raw_sub.next_msg(timeout=10)
            decoded = msgpack.unpackb(msg.data)
            assert list(decoded) == ["publisher_id", "sequence", "published_at", "topic", "payload"]
            assert (decoded["publisher_id"], decoded["sequence"], decoded["payload"]) == (
                pub.publisher_id,
                0,
                b"hello",
            )
            assert msg.headers is None
            assert (await sub.next(10)).payload == b"hello"
            # plain nats-py -> meshplane, including garbage that must only be counted
            await raw.publish(subject, b"\x00garbage")
            await raw.publish(subject, b"")
            await raw.publish(subject, dynamo_envelope(99, 0, "kv-events", b"from dynamo"))
            await raw.publish(subject, dynamo_envelope(99, 1, "other", b"wrong topic in envelope"))
            await raw.publish(subject, msgpack.packb([99, 2, 5, "kv-events", b"array"], use_bin_type=True))
            await raw.flush()
            first, second = await sub.next(10), await sub.next(10)
            assert (first.publisher_id, first.payload) == (99, b"from dynamo")
            assert (second.sequence, second.payload) == (2, b"array")
            assert dict(sub.stats.malformed) == {"version": 1, "truncated": 1}
            assert sub.stats.filtered == 1
    finally:
        await raw.close()


async def test_nats_messages_are_taken_in_bulk_and_nats_py_counts_none_pending(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The subscriber takes nats-py's queued messages in bulk, not a callback each; nats-py's count of
    pending bytes (its slow-consumer limit) must come back to zero as its own task would leave it."""
    config = make_config("nats", "file", tmp_path, nats_server, None)
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(SCOPE, "bulk")
        pub = await plane.publisher(SCOPE, "bulk")
        transport = sub._transport
        assert isinstance(transport, NatsSubscriberTransport)
        assert transport.drains_in_bulk  # fails on a nats-py without the queue: the slow path is taken
        await pub.publish_many([b"%d" % i for i in range(5000)])
        await pub.flush()
        got: list[bytes] = []
        async for batch in sub.batches():
            got += [envelope.payload for envelope in batch]
            if len(got) >= 5000:
                break
        assert got == [b"%d" % i for i in range(5000)]
        assert [s.pending_bytes for s in transport._subs] == [0, 0]
        assert (sub.stats.gaps, sub.stats.dropped_slow) == (0, 0)


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("transport", ["nats", "zmq"])
async def test_seed_framing_is_understood_by_a_default_subscriber(
    transport: str, codec: Codec, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    nats_server = request.getfixturevalue("nats_server") if transport == "nats" else None
    receiver = make_config(transport, "file", tmp_path, nats_server, None)
    sender = receiver.replace(wire_format=WireFormat.HEADER8, codec=codec)
    async with EventPlane(receiver) as sub_plane, EventPlane(sender) as pub_plane:
        sub = await sub_plane.subscriber(SCOPE, "seed")
        pub = await pub_plane.publisher(SCOPE, "seed")
        if transport == "zmq":
            await pub.wait_for_subscribers(1, 10)
        for i in range(10):
            await pub.publish({"i": i})
        assert [(await sub.next(10)).decode() for _ in range(10)] == [{"i": i} for i in range(10)]


async def test_a_publisher_that_starts_after_its_record_is_still_reached(
    zmq_config: PlaneConfig,
) -> None:
    """A failed first connect must not silence a publisher (Dynamo 1.6.1's weak spot)."""
    from meshplane.launchers import free_port

    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    write_dynamo_record(zmq_config.file_kv, "later", 5, endpoint)
    async with EventPlane(zmq_config) as plane:
        sub = await plane.subscriber(SCOPE, "later")
        # it has read the record and connects, while nobody listens yet: the first attempts fail
        await eventually(lambda: sub.stats.publishers_discovered == 1, what="the record read")
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.XPUB)
        sock.bind(endpoint)
        try:
            await asyncio.wait_for(sock.recv(), 10)
            await sock.send_multipart(dynamo_frames(5, 0, "later", b"finally"))
            assert (await sub.next(10)).payload == b"finally"
        finally:
            sock.close(0)
            ctx.term()
