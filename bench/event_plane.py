"""Event-plane benchmark: meshplane over ZeroMQ and NATS against raw pyzmq and raw nats-py, same run.

Separate publisher and subscriber processes, 100-byte payloads, the Dynamo wire layout on both sides
(the raw peers send pre-built frames and only count what arrives: they are the transport's ceiling).

    python bench/event_plane.py                 # 1 M events per throughput run, results to bench/results/
    python bench/event_plane.py --events 200000 --latency-events 5000

Throughput is the subscriber's rate from its first to its last event. Latency is publish-to-receive
(wall clock, same host) at a paced rate with both processes pinned to one core (`taskset -c 0`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq

PAYLOAD_SIZE = 100
TOPIC = "bench"
IDLE_SECONDS = 3.0
KINDS = ["zmq-raw", "zmq-meshplane", "nats-raw", "nats-meshplane"]


def payload(now_ns: int) -> bytes:
    """100 bytes whose first 8 carry the send time (for latency)."""
    return struct.pack(">Q", now_ns) + b"x" * (PAYLOAD_SIZE - 8)


def sent_at(data: bytes) -> int:
    return int(struct.unpack_from(">Q", data)[0])


class Tally:
    """What a subscriber counts: events, the time of the first and the last, and latencies."""

    def __init__(self, latency: bool) -> None:
        self.latency = latency
        self.count = 0
        self.first = self.last = 0.0
        self.latencies: list[int] = []

    def add(self, data: bytes | None) -> None:
        """Count one event; ``data`` is its payload when latencies are measured."""
        now = time.perf_counter()
        if not self.count:
            self.first = now
        self.last = now
        self.count += 1
        if data is not None:
            self.latencies.append(time.time_ns() - sent_at(data))

    def summary(self) -> dict[str, Any]:
        seconds = max(self.last - self.first, 1e-9)
        result: dict[str, Any] = {
            "received": self.count,
            "seconds": round(seconds, 4),
            "rate": round(self.count / seconds),
        }
        if self.latencies:
            self.latencies.sort()
            result["p50_us"] = round(self.latencies[len(self.latencies) // 2] / 1000, 1)
            result["p99_us"] = round(self.latencies[int(len(self.latencies) * 0.99)] / 1000, 1)
        return result


def emit(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


# ---- raw ZeroMQ ----------------------------------------------------------------------------------------


def dynamo_frames(seq: int, data: bytes) -> list[bytes]:
    envelope = msgspec.msgpack.encode(
        {"publisher_id": 1, "sequence": seq, "published_at": 0, "topic": TOPIC, "payload": data}
    )
    return [
        TOPIC.encode(),
        struct.pack(">Q", 1),
        struct.pack(">Q", seq),
        struct.pack(">BI", 1, len(envelope)) + envelope,
    ]


def zmq_raw_pub(events: int, interval: float, proxy: str = "") -> None:
    """Bind and print the endpoint, or (``proxy``) connect to a relay's XSUB side."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)  # a PUB on the wire; tells us when the subscriber is there
    sock.setsockopt(zmq.SNDHWM, 100_000)
    if proxy:
        sock.connect(proxy)
        emit({"ready": True})
    else:
        sock.bind("tcp://127.0.0.1:*")
        emit({"endpoint": sock.getsockopt_string(zmq.LAST_ENDPOINT)})
    sock.recv()
    # The ceiling: one pre-built message sent over and over (receivers do the same work for every copy).
    template = dynamo_frames(0, payload(0))
    for seq in range(events):
        sock.send_multipart(dynamo_frames(seq, payload(time.time_ns())) if interval else template)
        if interval:
            time.sleep(interval)
    sock.close(linger=5000)
    ctx.term()


def zmq_raw_sub(endpoint: str, events: int, latency: bool) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sock.connect(endpoint)
    sock.setsockopt(zmq.RCVTIMEO, int(IDLE_SECONDS * 1000))
    tally = Tally(latency)
    recv = sock.recv
    while tally.count < events:
        # the fastest multipart receive pyzmq offers (Frame.more; recv_multipart is ~2x slower)
        try:
            frame = recv(copy=False)
        except zmq.Again:
            break
        frames = [frame.bytes]
        while frame.more:
            frame = recv(copy=False)
            frames.append(frame.bytes)
        tally.add(msgspec.msgpack.decode(frames[3][5:])["payload"] if latency else None)
    emit(tally.summary())


# ---- raw NATS -------------------------------------------------------------------------------------------


async def nats_raw_pub(url: str, events: int, interval: float) -> None:
    import nats

    nc = await nats.connect(url)
    subject = f"namespace.bench.{TOPIC}"
    template = msgspec.msgpack.encode(
        {"publisher_id": 1, "sequence": 0, "published_at": 0, "topic": TOPIC, "payload": payload(0)}
    )
    for seq in range(events):
        if interval:
            data = msgspec.msgpack.encode(
                {
                    "publisher_id": 1,
                    "sequence": seq,
                    "published_at": 0,
                    "topic": TOPIC,
                    "payload": payload(time.time_ns()),
                }
            )
            await nc.publish(subject, data)
            await nc.flush()
            time.sleep(interval)  # noqa: ASYNC251 - same pacing in every run
        else:
            await nc.publish(subject, template)
    await nc.flush()
    await nc.close()


async def nats_raw_sub(url: str, events: int, latency: bool) -> None:
    import nats

    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    tally = Tally(latency)
    done = asyncio.Event()

    async def on_message(msg: Any) -> None:
        tally.add(msgspec.msgpack.decode(msg.data)["payload"] if latency else None)
        if tally.count >= events:
            done.set()

    await nc.subscribe(f"namespace.bench.{TOPIC}", cb=on_message, pending_msgs_limit=2_000_000)
    await nc.flush()
    emit({"ready": True})
    await _until_done_or_idle(done, tally)
    emit(tally.summary())
    await nc.close()


async def _until_done_or_idle(done: asyncio.Event, tally: Tally) -> None:
    seen = -1
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), IDLE_SECONDS)
        except TimeoutError:
            if tally.count == seen:
                return
            seen = tally.count


# ---- meshplane ------------------------------------------------------------------------------------------


def _config(transport: str, kv: str, url: str) -> Any:
    from meshplane import PlaneConfig

    # the environment may add broker mode (DYN_ZMQ_BROKER_URL)
    return PlaneConfig.from_env(
        event_plane=transport, discovery_backend="file", file_kv=Path(kv), nats_server=url or None
    )


async def meshplane_pub(transport: str, kv: str, url: str, events: int, interval: float) -> None:
    from meshplane import EventPublisher, Scope

    config = _config(transport, kv, url)
    pub = await EventPublisher.create(Scope.namespace("bench"), TOPIC, config=config)
    emit({"ready": True})
    if transport == "zmq":  # in broker mode the subscription arrives once through each broker
        await pub.wait_for_subscribers(max(1, len(config.zmq_brokers)), timeout=30)
    data = payload(0)
    publish = pub.publish
    for _ in range(events):
        if interval:
            await publish(payload(time.time_ns()))
            await pub.flush()
            time.sleep(interval)  # noqa: ASYNC251 - the raw peers' pacing (asyncio.sleep rounds up to 1 ms)
        else:
            await publish(data)
    await pub.flush()
    await pub.close()


async def meshplane_sub(transport: str, kv: str, url: str, events: int, latency: bool) -> None:
    from meshplane import EventSubscriber, Scope

    sub = await EventSubscriber.create(Scope.namespace("bench"), TOPIC, config=_config(transport, kv, url))
    emit({"ready": True})
    tally = Tally(latency)
    done = asyncio.Event()

    async def consume() -> None:
        async for envelope in sub:
            tally.add(envelope.payload if latency else None)
            if tally.count >= events:
                break
        done.set()

    consumer = asyncio.create_task(consume())
    await _until_done_or_idle(done, tally)
    consumer.cancel()
    result = tally.summary()
    result["gaps"] = sub.stats.gaps
    result["duplicates_dropped"] = sub.stats.duplicates_dropped
    emit(result)
    await sub.close()


# ---- orchestration --------------------------------------------------------------------------------------


def _spawn(args: list[str], pin: bool, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    prefix = ["taskset", "-c", "0"] if pin and shutil.which("taskset") else []
    return subprocess.Popen(
        [*prefix, sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, env=env
    )


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"benchmark process {proc.args!r} exited with {proc.wait()}")
    result: dict[str, Any] = json.loads(line)
    return result


def run_pair(
    kind: str,
    events: int,
    latency: bool,
    interval: float,
    nats_url: str,
    env: dict[str, str] | None = None,
    proxy: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One publisher process and one subscriber process; ``proxy`` = (xsub, xpub) of a relay for zmq-raw."""
    transport, impl = kind.split("-")
    pin = latency
    common = [str(events), "1" if latency else "0"]
    with tempfile.TemporaryDirectory() as kv:
        if kind == "zmq-raw" and proxy:
            sub = _spawn(["_sub", kind, kv, proxy[1], *common], pin)
            pub = _spawn(["_pub", kind, kv, proxy[0], str(events), str(interval)], pin)
            _read(pub)
        elif kind == "zmq-raw":
            pub = _spawn(["_pub", kind, kv, nats_url, str(events), str(interval)], pin)
            endpoint = _read(pub)["endpoint"]
            sub = _spawn(["_sub", kind, kv, endpoint, *common], pin)
        elif impl == "raw" or transport == "nats":
            sub = _spawn(["_sub", kind, kv, nats_url, *common], pin, env)
            _read(sub)  # subscribed: nothing published from now on is missed
            pub = _spawn(["_pub", kind, kv, nats_url, str(events), str(interval)], pin, env)
        else:  # zmq-meshplane: the publisher binds and registers, the subscriber discovers it
            pub = _spawn(["_pub", kind, kv, nats_url, str(events), str(interval)], pin, env)
            _read(pub)
            sub = _spawn(["_sub", kind, kv, nats_url, *common], pin, env)
            _read(sub)
        result = _read(sub)
        pub.wait(120)
        sub.wait(30)
    return result


def child(argv: list[str]) -> None:
    role, kind, kv, where, events, extra = argv[0], argv[1], argv[2], argv[3], int(argv[4]), argv[5]
    if role == "_pub":
        interval = float(extra)
        if kind == "zmq-raw":
            zmq_raw_pub(events, interval, where if where.startswith("tcp://") else "")
        elif kind == "nats-raw":
            asyncio.run(nats_raw_pub(where, events, interval))
        else:
            asyncio.run(meshplane_pub(kind.split("-")[0], kv, where, events, interval))
        return
    latency = extra == "1"
    if kind == "zmq-raw":
        zmq_raw_sub(where, events, latency)
    elif kind == "nats-raw":
        asyncio.run(nats_raw_sub(where, events, latency))
    else:
        asyncio.run(meshplane_sub(kind.split("-")[0], kv, where, events, latency))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events per throughput run (default 1 M)"
    )
    parser.add_argument("--latency-events", type=int, default=10_000, help="events per latency run")
    parser.add_argument("--interval", type=float, default=0.0005, help="seconds between latency-run events")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per kind; the median is kept")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "event_plane.json")
    args = parser.parse_args()

    from meshplane.cli.bench import Steps
    from meshplane.launchers import NatsServer

    steps = Steps(len(KINDS) * (args.repeat + 1))

    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "events": args.events,
        "payload_bytes": PAYLOAD_SIZE,
        "throughput": {},
        "latency_pinned_one_core": {},
    }
    with NatsServer() as nats_server:
        nats_server.start()
        for kind in KINDS:
            runs = []
            for n in range(args.repeat):
                runs.append(run_pair(kind, args.events, False, 0.0, nats_server.url))
                steps.step(f"{kind} throughput, run {n + 1}/{args.repeat}")
            rates = sorted(r["rate"] for r in runs)
            median = runs[[r["rate"] for r in runs].index(rates[len(rates) // 2])]
            results["throughput"][kind] = {**median, "runs": rates}
            print(f"{kind:15} throughput {median['rate']:>9,} events/s  received {median['received']:,}")
        for kind in KINDS:
            result = run_pair(kind, args.latency_events, True, args.interval, nats_server.url)
            results["latency_pinned_one_core"][kind] = result
            steps.step(f"{kind} latency")
            print(f"{kind:15} latency p50 {result.get('p50_us')} us  p99 {result.get('p99_us')} us")
    ratios = {}
    for transport in ("zmq", "nats"):
        raw, ours = results["throughput"][f"{transport}-raw"], results["throughput"][f"{transport}-meshplane"]
        lat_raw = results["latency_pinned_one_core"][f"{transport}-raw"]
        lat_ours = results["latency_pinned_one_core"][f"{transport}-meshplane"]
        ratios[transport] = {
            "throughput_ratio": round(ours["rate"] / raw["rate"], 2),
            "p50_latency_ratio": round(lat_ours["p50_us"] / lat_raw["p50_us"], 2),
            "p99_latency_ratio": round(lat_ours["p99_us"] / lat_raw["p99_us"], 2),
        }
        r = ratios[transport]
        print(
            f"{transport}: meshplane/raw throughput {r['throughput_ratio']}x, "
            f"p50 latency {r['p50_latency_ratio']}x, p99 {r['p99_latency_ratio']}x"
        )
    results["ratios"] = ratios
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        child(sys.argv[1:])
    else:
        main()
