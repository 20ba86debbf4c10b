"""Where each microsecond of an event goes: meshplane's publisher and subscriber, stage by stage.

One process, real ZeroMQ sockets over TCP loopback, 100-byte payloads. Each stage adds one layer to
the previous one and is timed over the same events, so the difference between two rows is what that
layer costs per event:

- subscriber (the socket is filled first, then drained: no waiting in the figures)
  ``recv (pyzmq)``: the raw receive loop (two zero-copy receives, ``Frame.more``, ``.bytes``: what the
  raw peer of ``bench/event_plane.py`` does); ``+ decode (pyzmq)``: ``ZmqSubscriberTransport.receive``
  without the C extension (the same receives, then the frame checks and the envelope decode);
  ``receive + decode (C)``: the same with the compiled receive loop (the default);
  ``+ intake``: ``Intake.accept`` (topic check, liveness, sequence tracking); ``+ iteration``: the whole
  ``EventSubscriber``, ``async for`` one event at a time; ``batches()``: ``async for batch in
  sub.batches()``.
- publisher (a connected subscriber that does not read): ``send (pyzmq)``: two raw sends of pre-built
  frames; ``+ envelope (pyzmq)``: building and encoding the envelope as ``publish`` does without the C
  extension; ``publish (pyzmq)``: ``await pub.publish(payload)`` without it; ``publish (C)``: with the
  compiled sender (the default); ``publish_many``: 1000 at a time.

    python bench/event_plane_profile.py [--events 200000] [--repeat 5] [--wire header8|dynamo]

Times are the Python thread's CPU time (``time.thread_time``: libzmq's I/O thread and other processes
are left out), the minimum over ``--repeat`` interleaved rounds (this VM's speed drifts; the minimum is
the least disturbed run). Results to bench/results/event_plane_profile.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import zmq

from harness import add_out, write_results
from meshplane import EventPlane, PlaneConfig, Scope, WireFormat
from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import ZmqEncoder
from meshplane.core.intake import Intake
from meshplane.transports.native import native_receive
from meshplane.transports.zmq import ZmqSubscriberTransport
from meshplane.transports.zmq_messages import direct_send
from meshplane.transports.zmq_readable import Readable

TOPIC = "bench"
PAYLOAD = b"x" * 100
SCOPE = Scope.namespace("bench")


def _config(kv: str, wire: WireFormat) -> PlaneConfig:
    return PlaneConfig.from_env(
        event_plane="zmq", discovery_backend="file", file_kv=Path(kv), heartbeat_period=0.0
    ).replace(wire_format=wire, send_hwm=0, receive_hwm=0)


async def _settle() -> None:
    """Give libzmq's I/O threads time to move every queued message into the receiving socket, so the
    timed drain never waits for the network (a stage that did would count only its waiting)."""
    await asyncio.sleep(1.0)


class Stages:
    def __init__(self, events: int, wire: WireFormat) -> None:
        self.events = events
        self.wire = wire

    # ---- subscriber --------------------------------------------------------------------------------

    async def _filled_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> tuple[Any, Any]:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        sub.connect(f"tcp://127.0.0.1:{port}")
        await asyncio.sleep(0.3)
        encoder = ZmqEncoder(TOPIC.encode(), 1, self.wire, Codec.MSGPACK)
        for sequence in range(self.events):
            for frame, more in _with_more(encoder.encode(EventEnvelope(1, sequence, 0, TOPIC, PAYLOAD))):
                pub.send(frame, zmq.SNDMORE if more else 0)
        await _settle()
        return pub, sub

    async def sub_recv(self, ctx: Any) -> float:
        pub, sub = await self._filled_socket(ctx)
        recv = sub.recv
        started = time.thread_time()
        for _ in range(self.events):
            frame = recv(copy=False)
            frames = [frame.bytes]
            while frame.more:
                frame = recv(copy=False)
                frames.append(frame.bytes)
        elapsed = time.thread_time() - started
        pub.close(0)
        sub.close(0)
        return elapsed

    async def _transport(self, ctx: Any, intake: Intake | None, compiled: bool = True) -> float:
        pub, sub = await self._filled_socket(ctx)
        transport = ZmqSubscriberTransport(ctx, TOPIC.encode(), 0, 8 * 1024 * 1024, envelope_topic=TOPIC)
        transport._socket, transport._readable = sub, Readable(sub)  # the filled socket
        transport._native = native_receive() if compiled else None
        left = self.events
        started = time.thread_time()
        while left > 0:
            batch = await transport.receive()
            if intake is not None and (run := transport.batch_run) is not None:
                intake.accept_run(cast(list[EventEnvelope], batch), *run, time.monotonic())
            elif intake is not None:
                intake.accept(batch, time.monotonic())
            left -= len(batch)
        elapsed = time.thread_time() - started
        await transport.close()
        pub.close(0)
        return elapsed

    async def sub_decode_pyzmq(self, ctx: Any) -> float:
        return await self._transport(ctx, None, compiled=False)

    async def sub_decode(self, ctx: Any) -> float:
        return await self._transport(ctx, None)

    async def sub_intake(self, ctx: Any) -> float:
        return await self._transport(
            ctx, Intake(TOPIC, [TOPIC.encode()], liveness_timeout=3.0, reorder_window=0.05)
        )

    async def _subscriber(self, batches: bool) -> float:
        with tempfile.TemporaryDirectory() as kv:
            async with EventPlane(_config(kv, self.wire)) as plane:
                pub = await plane.publisher(SCOPE, TOPIC)
                sub = await plane.subscriber(SCOPE, TOPIC)
                await pub.wait_for_subscribers(1, timeout=10)
                await pub.publish_many([PAYLOAD] * self.events)
                await _settle()
                left = self.events
                started = time.thread_time()
                if batches:
                    async for batch in sub.batches():
                        left -= len(batch)
                        if left <= 0:
                            break
                else:
                    async for _ in sub:
                        left -= 1
                        if left <= 0:
                            break
                elapsed = time.thread_time() - started
                assert sub.stats.gaps == 0, "the profile lost events: raise the high-water marks"
                return elapsed

    async def sub_iteration(self, ctx: Any) -> float:
        return await self._subscriber(batches=False)

    async def sub_batches(self, ctx: Any) -> float:
        return await self._subscriber(batches=True)

    # ---- publisher ---------------------------------------------------------------------------------

    async def _publisher(self, body: Callable[[Any], Awaitable[float]]) -> float:
        with tempfile.TemporaryDirectory() as kv:
            async with EventPlane(_config(kv, self.wire)) as plane:
                pub = await plane.publisher(SCOPE, TOPIC)
                ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
                sink = ctx.socket(zmq.SUB)  # connected and subscribed, never read: sends go to its queue
                sink.setsockopt(zmq.RCVHWM, 0)
                sink.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
                sink.connect(pub._transport.endpoint)  # type: ignore[attr-defined]
                await pub.wait_for_subscribers(1, timeout=10)
                elapsed = await body(pub)
                sink.close(0)
                return elapsed

    async def pub_send(self, ctx: Any) -> float:
        async def body(pub: Any) -> float:
            sock = pub._transport._socket
            frames = ZmqEncoder(TOPIC.encode(), 1, self.wire, Codec.MSGPACK).encode(
                EventEnvelope(1, 0, 0, TOPIC, PAYLOAD)
            )
            *head, last = frames
            send = direct_send(sock)
            started = time.thread_time()
            for _ in range(self.events):
                for frame in head:
                    send(frame, zmq.SNDMORE)
                send(last, 0)
            return time.thread_time() - started

        return await self._publisher(body)

    async def pub_envelope(self, ctx: Any) -> float:
        async def body(pub: Any) -> float:
            sock = pub._transport._socket
            send_event = ZmqEncoder(TOPIC.encode(), 1, self.wire, Codec.MSGPACK).event_sender(
                direct_send(sock), zmq.SNDMORE, 0
            )
            started = time.thread_time()
            for sequence in range(self.events):
                send_event(EventEnvelope(1, sequence, time.time_ns() // 1_000_000, TOPIC, PAYLOAD))
            return time.thread_time() - started

        return await self._publisher(body)

    async def _publish(self, compiled: bool) -> float:
        async def body(pub: Any) -> float:
            if not compiled:
                pub._transport.send_payload = None  # as without the C extension: envelopes through pyzmq
            publish = pub.publish
            started = time.thread_time()
            for _ in range(self.events):
                await publish(PAYLOAD)
            return time.thread_time() - started

        return await self._publisher(body)

    async def pub_publish_pyzmq(self, ctx: Any) -> float:
        return await self._publish(compiled=False)

    async def pub_publish(self, ctx: Any) -> float:
        return await self._publish(compiled=True)

    async def pub_publish_many(self, ctx: Any) -> float:
        async def body(pub: Any) -> float:
            chunk = [PAYLOAD] * 1000
            started = time.thread_time()
            for _ in range(self.events // 1000):
                await pub.publish_many(chunk)
            return time.thread_time() - started

        return await self._publisher(body)


def _with_more(frames: list[bytes]) -> list[tuple[bytes, bool]]:
    return [(frame, i < len(frames) - 1) for i, frame in enumerate(frames)]


STAGES = {
    "subscriber": [
        ("recv (pyzmq)", "sub_recv"),
        ("+ decode (pyzmq)", "sub_decode_pyzmq"),
        ("receive + decode (C)", "sub_decode"),
        ("+ intake", "sub_intake"),
        ("+ iteration (async for)", "sub_iteration"),
        ("batches()", "sub_batches"),
    ],
    "publisher": [
        ("send (pyzmq)", "pub_send"),
        ("+ envelope (pyzmq)", "pub_envelope"),
        ("publish (pyzmq)", "pub_publish_pyzmq"),
        ("publish (C)", "pub_publish"),
        ("publish_many", "pub_publish_many"),
    ],
}


async def run(events: int, repeat: int, wire: WireFormat) -> dict[str, Any]:
    stages = Stages(events, wire)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    best: dict[str, float] = {}
    for _ in range(repeat):  # rounds of every stage, so a drift of the VM's speed hits all alike
        for rows in STAGES.values():
            for _, method in rows:
                seconds = await getattr(stages, method)(ctx)
                best[method] = min(best.get(method, seconds), seconds)
    ctx.term()
    results: dict[str, Any] = {}
    for side, rows in STAGES.items():
        results[side] = {}
        previous = None
        for label, method in rows:
            ns = results[side][label] = round(best[method] / events * 1e9)
            added = f"  (+{ns - previous} ns)" if previous is not None and label.startswith("+") else ""
            print(f"{side:10} {label:26} {ns:6,} ns/event{added}", flush=True)
            previous = ns
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--wire", default="header8", choices=["header8", "dynamo"])
    add_out(parser, "event_plane_profile")
    args = parser.parse_args()
    out: dict[str, Any] = {"machine": {"python": platform.python_version(), "platform": platform.platform()}}
    if args.out.exists():
        out = {**json.loads(args.out.read_text()), **out}
    out[args.wire] = {
        "events": args.events,
        "ns_per_event": asyncio.run(run(args.events, args.repeat, WireFormat(args.wire))),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
