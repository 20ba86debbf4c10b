"""The Dynamo runtime's own Python event-plane pair, as a peer of ``bench/event_plane.py``.

ai-dynamo-runtime 1.6.1 exposes no general publisher/subscriber to Python; its one pair that carries an
event per call over the event plane is the forward-pass metrics pair: ``FpmDirectPublisher.publish``
(one snapshot per call, serialized on the Rust side) and ``FpmEventSubscriber.recv`` (blocking, the GIL
released). Both run here on ZeroMQ with file discovery, as meshplane's ZeroMQ kinds do.

Run by ``event_plane.py`` with the Python of a separate venv (``make .venv-dynamo``: the runtime pins
a pydantic older than ours), so this file imports only the standard library and ``dynamo``. Roles:

    python dynamo_runtime_peer.py pub EVENTS INTERVAL   # registers, says ready, publishes on "go"
    python dynamo_runtime_peer.py sub EVENTS LATENCY    # says ready once it hears the publisher

Lines on stdout are JSON, as the other peers': the subscriber's last one has received, rate,
p50_us / p99_us (latency runs) and cpu_us_per_event; the publisher's, cpu_us_per_event.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import struct
import sys
import threading
import time
from typing import Any

from dynamo._core import DistributedRuntime, FpmDirectPublisher, FpmEventSubscriber

ENDPOINT = "bench.worker.generate"
IDLE_SECONDS = 3.0
# A snapshot's wall_time (a MessagePack float 64): the publisher's clock for events, 0.0 in the
# zeroed snapshots the Rust side sends as idle heartbeats.
WALL_TIME = b"\xa9wall_time\xcb"


def emit(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread: the Rust runtime's too
    return usage.ru_utime + usage.ru_stime


def wall_time(snapshot: bytes) -> float:
    at = snapshot.find(WALL_TIME)
    return 0.0 if at < 0 else float(struct.unpack_from(">d", snapshot, at + len(WALL_TIME))[0])


async def publish(events: int, interval: float) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
    publisher = FpmDirectPublisher(runtime.endpoint(ENDPOINT), "bench", 1)
    emit({"ready": True})
    await asyncio.to_thread(sys.stdin.readline)  # "go": the subscriber is connected
    started = cpu_seconds()
    for i in range(events):
        publisher.publish(
            dp_rank=0,
            scheduled_num_prefill_requests=i,
            scheduled_sum_prefill_tokens=0,
            scheduled_sum_prefill_kv_tokens=0,
            scheduled_num_decode_requests=0,
            scheduled_sum_decode_kv_tokens=0,
            queued_num_prefill_requests=0,
            queued_sum_prefill_tokens=0,
            queued_num_decode_requests=0,
            queued_sum_decode_kv_tokens=0,
            wall_time_secs=time.time(),
        )
        if interval:
            time.sleep(interval)  # noqa: ASYNC251 - the other peers' pacing
    await asyncio.sleep(IDLE_SECONDS)  # its Rust tasks send what was queued
    emit({"cpu_us_per_event": round((cpu_seconds() - started) / max(events, 1) * 1e6, 2)})
    publisher.shutdown()
    runtime.shutdown()


async def subscribe(events: int, latency: bool) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
    subscriber = FpmEventSubscriber(runtime.endpoint(ENDPOINT))
    heard, done = threading.Event(), threading.Event()
    count, first, last, cpu_at_first = 0, 0.0, 0.0, 0.0
    latencies: list[float] = []

    def receive() -> None:
        nonlocal count, first, last, cpu_at_first
        while count < events:
            snapshot = subscriber.recv()
            if snapshot is None:
                return
            heard.set()
            sent = wall_time(snapshot)
            if not sent:
                continue  # an idle heartbeat
            now = time.perf_counter()
            if not count:
                first, cpu_at_first = now, cpu_seconds()
            last = now
            count += 1
            if latency:
                latencies.append(time.time() - sent)
        done.set()

    threading.Thread(target=receive, daemon=True).start()
    await asyncio.to_thread(heard.wait)  # the publisher's first idle heartbeat: connected
    emit({"ready": True})
    seen = -1
    # until all arrived, or nothing more came for IDLE_SECONDS
    while not await asyncio.to_thread(done.wait, IDLE_SECONDS) and count != seen:
        seen = count
    seconds = max(last - first, 1e-9)
    result: dict[str, Any] = {"received": count, "seconds": round(seconds, 4), "rate": round(count / seconds)}
    if latencies:
        latencies.sort()
        result["p50_us"] = round(latencies[len(latencies) // 2] * 1e6, 1)
        result["p99_us"] = round(latencies[int(len(latencies) * 0.99)] * 1e6, 1)
    result["cpu_us_per_event"] = round((cpu_seconds() - cpu_at_first) / max(count, 1) * 1e6, 2)
    emit(result)
    runtime.shutdown()
    os._exit(0)  # not waiting for the receiving thread, blocked in recv() (its cancellation aborts)


if __name__ == "__main__":
    role, events, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if role == "pub":
        asyncio.run(publish(events, float(extra)))
    else:
        asyncio.run(subscribe(events, extra == "1"))
