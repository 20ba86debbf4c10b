"""Event-plane benchmark: meshplane over ZeroMQ and NATS against raw pyzmq and raw nats-py, same run.

Separate publisher and subscriber processes, 100-byte payloads (the raw peers send pre-built frames and
only count what arrives: they are the transport's ceiling). Kinds, as ``transport-implementation``:

- ``zmq``: the Dynamo layout (4 frames) over ZeroMQ; ``zmq8``: the 8-byte-header layout (2 frames);
  ``nats``: the Dynamo layout over NATS.
- ``faststream`` (``nats`` only): FastStream's NatsBroker, the bare payload, one ``publish`` each;
- ``raw``: pyzmq / nats-py alone; ``asyncio`` (``zmq8`` only): raw pyzmq received on asyncio, the floor
  of an asyncio subscriber's latency; ``meshplane``: ``publish`` and ``async for`` one event at a time;
  ``batch``: ``publish_many`` (1000 at a time) and ``async for batch in sub.batches()``, counted a batch
  at a time (latency runs look at every event);
  ``busypoll`` (ZeroMQ): as ``meshplane``, the subscriber spinning 2 ms after each batch
  (``MESHPLANE_BUSY_POLL=0.002``, longer than the latency runs' pace) instead of sleeping in its loop;
  ``uvloop`` (ZeroMQ): as ``meshplane``, publisher and subscriber on uvloop (not run by default:
  ``--kinds zmq-uvloop,zmq8-uvloop,...``).
- ``dynamo-runtime``: the Dynamo runtime's own Python pair over ZeroMQ (``bench/dynamo_runtime_peer.py``:
  its forward-pass-metrics publisher and subscriber, ~420-byte snapshots), run with the Python of
  ``.venv-dynamo`` (``make .venv-dynamo``; ``MESHPLANE_BENCH_DYNAMO_PYTHON`` names another), left out
  when that venv is not there.

    python bench/event_plane.py                 # 1 M events per throughput run, results to bench/results/
    python bench/event_plane.py --events 200000 --latency-events 5000

meshplane's ZeroMQ publishers run with ``MESHPLANE_SEND_WHEN_FULL=wait`` (lossless) unless the
environment says otherwise. Throughput is the subscriber's rate from its first to its last event, in
interleaved rounds (every kind once per round, so a drift of this VM's speed hits all alike); a ratio is
the median of per-round ratios. CPU per event is each process's user + system time (its libzmq /
nats-py threads included) over the events. Latency is publish-to-receive (wall clock, same host) at a
paced rate with both processes pinned to one core (`taskset -c 0`), also in interleaved rounds
(``--latency-rounds``); its ratios are medians of per-round ratios too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.backend

from harness import add_out, emit, write_results
from meshplane import runloop

PAYLOAD_SIZE = 100
TOPIC = "bench"
IDLE_SECONDS = 3.0
KINDS = [
    "zmq-raw",
    "zmq-meshplane",
    "zmq-busypoll",
    "zmq8-raw",
    "zmq8-asyncio",
    "zmq8-meshplane",
    "zmq8-busypoll",
    "zmq8-batch",
    "nats-raw",
    "nats-meshplane",
    "nats-batch",
    "nats-faststream",
    "dynamo-runtime",
]
DYNAMO_PYTHON = Path(
    os.environ.get("MESHPLANE_BENCH_DYNAMO_PYTHON")
    or Path(__file__).parent.parent / ".venv-dynamo" / "bin" / "python"
)
#: What each ratio compares: (meshplane kind, peer kind).
RATIOS = {
    "dynamo_layout_zmq_vs_raw_pyzmq_4_frames": ("zmq-meshplane", "zmq-raw"),
    "header8_zmq_vs_raw_pyzmq_2_frames": ("zmq8-meshplane", "zmq8-raw"),
    "header8_zmq_batch_vs_raw_pyzmq_2_frames": ("zmq8-batch", "zmq8-raw"),
    "dynamo_layout_zmq_busy_poll_vs_raw_pyzmq_4_frames": ("zmq-busypoll", "zmq-raw"),
    "header8_zmq_busy_poll_vs_raw_pyzmq_2_frames": ("zmq8-busypoll", "zmq8-raw"),
    "header8_zmq_vs_raw_pyzmq_on_asyncio": ("zmq8-meshplane", "zmq8-asyncio"),
    "header8_zmq_vs_raw_nats_py": ("zmq8-meshplane", "nats-raw"),
    "nats_vs_raw_nats_py": ("nats-meshplane", "nats-raw"),
    "nats_batch_vs_raw_nats_py": ("nats-batch", "nats-raw"),
    "nats_vs_faststream_nats_broker": ("nats-meshplane", "nats-faststream"),
    "header8_zmq_vs_faststream_nats_broker": ("zmq8-meshplane", "nats-faststream"),
    "dynamo_layout_zmq_uvloop_vs_raw_pyzmq_4_frames": ("zmq-uvloop", "zmq-raw"),
    "header8_zmq_uvloop_vs_raw_pyzmq_2_frames": ("zmq8-uvloop", "zmq8-raw"),
    "dynamo_layout_zmq_vs_dynamo_runtime_pair": ("zmq-meshplane", "dynamo-runtime"),
    "header8_zmq_vs_dynamo_runtime_pair": ("zmq8-meshplane", "dynamo-runtime"),
}
PUBLISH_MANY = 1000


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
        self.cpu_at_first = 0.0
        self.latencies: list[int] = []
        self.untimed = 0

    def add(self, data: bytes | None) -> None:
        """Count one event; ``data`` is its payload when latencies are measured."""
        now = time.perf_counter()
        if not self.count:
            self.first = now
            self.cpu_at_first = cpu_seconds()
        self.last = now
        self.count += 1
        if data is not None:
            self.latencies.append(time.time_ns() - sent_at(data))

    def add_batch(self, count: int) -> None:
        """Count a batch at once, as a consumer of ``batches()`` does (no clock read per event): the
        first batch's arrival is the start, as the first event's is for ``add``."""
        now = time.perf_counter()
        if not self.count:
            self.first = now
            self.cpu_at_first = cpu_seconds()
            self.untimed = count - 1  # the first batch's events but one arrived before the clock started
        self.last = now
        self.count += count

    def summary(self) -> dict[str, Any]:
        seconds = max(self.last - self.first, 1e-9)
        result: dict[str, Any] = {
            "received": self.count,
            "seconds": round(seconds, 4),
            "rate": round((self.count - self.untimed) / seconds),
        }
        if self.latencies:
            self.latencies.sort()
            result["p50_us"] = round(self.latencies[len(self.latencies) // 2] / 1000, 1)
            result["p99_us"] = round(self.latencies[int(len(self.latencies) * 0.99)] / 1000, 1)
        return result


def emit_cpu(events: int, since: float) -> None:
    """A publisher's last line: its CPU time per event since ``since`` (every thread: libzmq's and
    nats-py's too; not its start-up)."""
    emit({"cpu_us_per_event": round((cpu_seconds() - since) / max(events, 1) * 1e6, 2)})


def cpu_per_event(tally: Tally) -> dict[str, float]:
    """A subscriber's CPU time per event from its first event on."""
    timed = max(tally.count - tally.untimed, 1)
    return {"cpu_us_per_event": round((cpu_seconds() - tally.cpu_at_first) / timed * 1e6, 2)}


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


def header8_frames(seq: int, data: bytes) -> list[bytes]:
    envelope = msgspec.msgpack.encode(
        {"publisher_id": 1, "sequence": seq, "published_at": 0, "topic": TOPIC, "payload": data}
    )
    return [TOPIC.encode(), struct.pack(">BBBBI", 2, 1, 1, 0, len(envelope)) + envelope]


def zmq_raw_pub(events: int, interval: float, proxy: str = "", header8: bool = False) -> None:
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
    started = cpu_seconds()
    # The ceiling: one pre-built message sent over and over (receivers do the same work for every copy).
    frames = header8_frames if header8 else dynamo_frames
    template = frames(0, payload(0))
    *head, last = template
    # Frame by frame (send_multipart re-checks every frame), and the compiled send without pyzmq's Python
    # wrapper (it only adds routing_id / group): pyzmq's fastest send, as meshplane's publisher does.
    send = types.MethodType(zmq.backend.Socket.send, sock)
    for seq in range(events):
        if interval:
            *head, last = frames(seq, payload(time.time_ns()))
        for frame in head:
            send(frame, zmq.SNDMORE)
        send(last)
        if interval:
            time.sleep(interval)
    sock.close(linger=5000)
    ctx.term()
    emit_cpu(events, started)


def zmq_raw_sub(endpoint: str, events: int, latency: bool, header8: bool = False) -> None:
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
        if latency:
            tally.add(msgspec.msgpack.decode(frames[1][8:] if header8 else frames[3][5:])["payload"])
        else:
            tally.add(None)
    emit({**tally.summary(), **cpu_per_event(tally)})


async def zmq_asyncio_sub(endpoint: str, events: int, latency: bool) -> None:
    """Raw pyzmq on asyncio, 8-byte-header layout: the floor of any asyncio ZeroMQ subscriber (the
    loop's reader callback on ZMQ_FD, ZMQ_EVENTS, then receives until EAGAIN), no decoding."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sock.connect(endpoint)
    loop = asyncio.get_running_loop()
    tally = Tally(latency)
    done = asyncio.Event()
    readable = asyncio.Event()
    events_opt, pollin, noblock = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)

    def on_signal() -> None:
        if int(sock.get(events_opt)) & pollin:
            readable.set()

    async def consume() -> None:
        recv = sock.recv
        loop.add_reader(int(sock.get(zmq.FD)), on_signal)
        while tally.count < events:
            if not int(sock.get(events_opt)) & pollin:
                readable.clear()
                await readable.wait()
            while True:
                try:
                    frame = recv(noblock, copy=False)
                except zmq.Again:
                    break
                frames = [frame.bytes]
                while frame.more:
                    frame = recv(noblock, copy=False)
                    frames.append(frame.bytes)
                tally.add(msgspec.msgpack.decode(frames[1][8:])["payload"] if latency else None)
        done.set()

    consumer = asyncio.create_task(consume())
    await _until_done_or_idle(done, tally)
    consumer.cancel()
    emit({**tally.summary(), **cpu_per_event(tally)})


# ---- raw NATS -------------------------------------------------------------------------------------------


async def nats_raw_pub(url: str, events: int, interval: float) -> None:
    import nats

    nc = await nats.connect(url)
    subject = f"namespace.bench.{TOPIC}"
    started = cpu_seconds()
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
    emit_cpu(events, started)


async def nats_raw_sub(url: str, events: int, latency: bool) -> None:
    import nats

    from meshplane.transports.nats import flush_in_order

    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    tally = Tally(latency)
    done = asyncio.Event()

    async def on_message(msg: Any) -> None:
        tally.add(msgspec.msgpack.decode(msg.data)["payload"] if latency else None)
        if tally.count >= events:
            done.set()

    await nc.subscribe(f"namespace.bench.{TOPIC}", cb=on_message, pending_msgs_limit=2_000_000)
    await flush_in_order(nc, 10)  # nats-py's flush alone may answer before the server has the SUB
    emit({"ready": True})
    await _until_done_or_idle(done, tally)
    emit({**tally.summary(), **cpu_per_event(tally)})
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


# ---- FastStream (what a Python user would otherwise pick) -------------------------------------------------


async def faststream_pub(url: str, events: int, interval: float) -> None:
    """FastStream's NatsBroker, one ``publish`` per event (it has no batch publish on NATS), the bare
    payload as body (FastStream has no envelope, sequence or gap detection)."""
    from faststream.nats import NatsBroker

    broker = NatsBroker(url, logger=None)  # its log lines would go to stdout, where results are read
    await broker.connect()
    subject = f"namespace.bench.{TOPIC}"
    data = payload(0)
    started = cpu_seconds()
    for _ in range(events):
        if interval:
            await broker.publish(payload(time.time_ns()), subject)
            await broker.connection.flush()
            time.sleep(interval)  # noqa: ASYNC251 - same pacing in every run
        else:
            await broker.publish(data, subject)
    await broker.connection.flush()
    await broker.stop()
    emit_cpu(events, started)


async def faststream_sub(url: str, events: int, latency: bool) -> None:
    from faststream.nats import NatsBroker

    broker = NatsBroker(url, logger=None)  # its log lines would go to stdout, where results are read
    tally = Tally(latency)
    done = asyncio.Event()

    @broker.subscriber(f"namespace.bench.{TOPIC}")
    async def on_message(body: bytes) -> None:
        tally.add(body if latency else None)
        if tally.count >= events:
            done.set()

    await broker.start()
    await broker.connection.flush()
    emit({"ready": True})
    await _until_done_or_idle(done, tally)
    emit({**tally.summary(), **cpu_per_event(tally)})
    await broker.stop()


# ---- meshplane ------------------------------------------------------------------------------------------


def _config(transport: str, kv: str, url: str) -> Any:
    from meshplane import PlaneConfig, WireFormat

    # the environment may add broker mode (DYN_ZMQ_BROKER_URL) and MESHPLANE_SEND_WHEN_FULL (main() sets
    # "wait" unless told otherwise)
    config = PlaneConfig.from_env(
        event_plane="zmq" if transport == "zmq8" else transport,
        discovery_backend="file",
        file_kv=Path(kv),
        nats_server=url or None,
    )
    return config.replace(wire_format=WireFormat.HEADER8) if transport == "zmq8" else config


async def meshplane_pub(
    transport: str, kv: str, url: str, events: int, interval: float, batch: bool = False
) -> None:
    from meshplane import EventPublisher, Scope

    config = _config(transport, kv, url)
    pub = await EventPublisher.create(Scope.namespace("bench"), TOPIC, config=config)
    emit({"ready": True})
    if config.event_plane == "zmq":  # in broker mode the subscription arrives once through each broker
        await pub.wait_for_subscribers(max(1, len(config.zmq_brokers)), timeout=30)
    data = payload(0)
    started = cpu_seconds()
    publish = pub.publish
    if batch and not interval:
        chunk = [data] * PUBLISH_MANY
        for start in range(0, events, PUBLISH_MANY):
            await pub.publish_many(chunk[: min(PUBLISH_MANY, events - start)])
    for _ in range(events):
        if interval:
            await publish(payload(time.time_ns()))
            await pub.flush()
            time.sleep(interval)  # noqa: ASYNC251 - the raw peers' pacing (asyncio.sleep rounds up to 1 ms)
        elif not batch:
            await publish(data)
    await pub.flush()
    await pub.close()
    emit_cpu(events, started)


async def meshplane_sub(
    transport: str, kv: str, url: str, events: int, latency: bool, batch: bool = False
) -> None:
    from meshplane import EventSubscriber, Scope

    sub = await EventSubscriber.create(Scope.namespace("bench"), TOPIC, config=_config(transport, kv, url))
    emit({"ready": True})
    tally = Tally(latency)
    done = asyncio.Event()

    async def consume() -> None:
        if batch:
            async for envelopes in sub.batches():
                if latency:
                    for envelope in envelopes:
                        tally.add(envelope.payload)
                else:
                    tally.add_batch(len(envelopes))
                if tally.count >= events:
                    break
        else:
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
    emit({**result, **cpu_per_event(tally)})
    await sub.close()


# ---- orchestration --------------------------------------------------------------------------------------


def _spawn(
    args: list[str], pin: bool, env: dict[str, str] | None = None, command: list[str] | None = None
) -> subprocess.Popen[str]:
    prefix = ["taskset", "-c", "0"] if pin and shutil.which("taskset") else []
    return subprocess.Popen(
        [*prefix, *(command or [sys.executable, __file__]), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
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
    publish = [str(events), str(interval)]
    with tempfile.TemporaryDirectory() as kv:
        if kind == "dynamo-runtime":
            peer = [str(DYNAMO_PYTHON), str(Path(__file__).parent / "dynamo_runtime_peer.py")]
            dynamo_env = {**os.environ, "DYN_FILE_KV": kv, "DYN_LOG": "error"}
            pub = _spawn(["pub", *publish], pin, dynamo_env, peer)
            _read(pub)  # registered
            sub = _spawn(["sub", *common], pin, dynamo_env, peer)
            _read(sub)  # it heard the publisher: connected
            assert pub.stdin is not None
            pub.stdin.write("go\n")
            pub.stdin.flush()
        elif kind == "zmq-raw" and proxy:
            sub = _spawn(["_sub", kind, kv, proxy[1], *common], pin)
            pub = _spawn(["_pub", kind, kv, proxy[0], *publish], pin)
            _read(pub)
        elif transport != "nats" and impl in ("raw", "asyncio"):
            pub = _spawn(["_pub", kind, kv, nats_url, *publish], pin)
            endpoint = _read(pub)["endpoint"]
            sub = _spawn(["_sub", kind, kv, endpoint, *common], pin)
        elif transport == "nats":
            sub = _spawn(["_sub", kind, kv, nats_url, *common], pin, env)
            _read(sub)  # subscribed: nothing published from now on is missed
            pub = _spawn(["_pub", kind, kv, nats_url, *publish], pin, env)
        else:  # meshplane over ZeroMQ: the publisher binds and registers, the subscriber discovers it
            pub = _spawn(["_pub", kind, kv, nats_url, *publish], pin, env)
            _read(pub)
            sub = _spawn(["_sub", kind, kv, nats_url, *common], pin, env)
            _read(sub)
        result = _read(sub)
        result["sub_cpu_us_per_event"] = result.pop("cpu_us_per_event")
        while "cpu_us_per_event" not in (line := _read(pub)):
            pass  # its "ready" line, where nobody waited for it
        result["pub_cpu_us_per_event"] = line["cpu_us_per_event"]
        pub.wait(120)
        sub.wait(30)
    return result


def child(argv: list[str]) -> None:
    role, kind, kv, where, events, extra = argv[0], argv[1], argv[2], argv[3], int(argv[4]), argv[5]
    transport, impl = kind.split("-")
    if impl == "uvloop":
        os.environ["MESHPLANE_LOOP"] = "uvloop"
    if role == "_pub":
        interval = float(extra)
        if transport != "nats" and impl in ("raw", "asyncio"):
            proxy = where if where.startswith("tcp://") else ""
            zmq_raw_pub(events, interval, proxy, header8=transport == "zmq8")
        elif kind == "nats-raw":
            asyncio.run(nats_raw_pub(where, events, interval))
        elif kind == "nats-faststream":
            asyncio.run(faststream_pub(where, events, interval))
        else:
            runloop.run(meshplane_pub(transport, kv, where, events, interval, batch=impl == "batch"))
        return
    latency = extra == "1"
    if impl == "busypoll":
        os.environ["MESHPLANE_BUSY_POLL"] = "0.002"
    if kind == "zmq8-asyncio":
        asyncio.run(zmq_asyncio_sub(where, events, latency))
    elif transport != "nats" and impl == "raw":
        zmq_raw_sub(where, events, latency, header8=transport == "zmq8")
    elif kind == "nats-raw":
        asyncio.run(nats_raw_sub(where, events, latency))
    elif kind == "nats-faststream":
        asyncio.run(faststream_sub(where, events, latency))
    else:
        runloop.run(meshplane_sub(transport, kv, where, events, latency, batch=impl == "batch"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events per throughput run (default 1 M)"
    )
    parser.add_argument("--latency-events", type=int, default=10_000, help="events per latency run")
    parser.add_argument("--interval", type=float, default=0.0005, help="seconds between latency-run events")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of throughput runs; medians are kept")
    parser.add_argument("--latency-rounds", type=int, default=3, help="rounds of latency runs")
    add_out(parser, "event_plane")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default all)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if "dynamo-runtime" in kinds and not DYNAMO_PYTHON.exists():
        kinds.remove("dynamo-runtime")
        print(f"dynamo-runtime left out: no {DYNAMO_PYTHON} (make .venv-dynamo installs ai-dynamo-runtime)")
    # meshplane's publishers wait at a full subscriber queue instead of dropping, so every meshplane run
    # delivers every event (MESHPLANE_SEND_WHEN_FULL=drop measures the default, lossy PUB behaviour)
    os.environ.setdefault("MESHPLANE_SEND_WHEN_FULL", "wait")

    from meshplane.cli.bench import Steps
    from meshplane.launchers import NatsServer

    steps = Steps(len(kinds) * (args.repeat + args.latency_rounds))  # every kind once per round

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
    rounds: list[dict[str, dict[str, Any]]] = []
    with NatsServer() as nats_server:
        nats_server.start()
        for n in range(args.repeat):
            this_round = {}
            for kind in kinds:
                this_round[kind] = run_pair(kind, args.events, False, 0.0, nats_server.url)
                steps.step(f"{kind} throughput, round {n + 1}/{args.repeat}")
                r = this_round[kind]
                print(
                    f"round {n + 1} {kind:15} {r['rate']:>9,} events/s  received {r['received']:,}  "
                    f"CPU/event pub {r['pub_cpu_us_per_event']} us, sub {r['sub_cpu_us_per_event']} us"
                )
            rounds.append(this_round)
        for kind in kinds:
            runs = [r[kind] for r in rounds]
            rates = sorted(run["rate"] for run in runs)
            median = runs[[run["rate"] for run in runs].index(rates[len(rates) // 2])]
            results["throughput"][kind] = {
                **median,
                "runs": rates,
                "lost": sum(args.events - run["received"] for run in runs),
                "pub_cpu_us_per_event": statistics.median(run["pub_cpu_us_per_event"] for run in runs),
                "sub_cpu_us_per_event": statistics.median(run["sub_cpu_us_per_event"] for run in runs),
            }
        latency_rounds: list[dict[str, dict[str, Any]]] = []
        for n in range(args.latency_rounds):  # interleaved too: this VM's latency drifts between minutes
            this_round = {}
            for kind in kinds:
                this_round[kind] = run_pair(kind, args.latency_events, True, args.interval, nats_server.url)
                steps.step(f"{kind} latency, round {n + 1}/{args.latency_rounds}")
                r = this_round[kind]
                print(f"round {n + 1} {kind:15} latency p50 {r.get('p50_us')} us  p99 {r.get('p99_us')} us")
            latency_rounds.append(this_round)
        for kind in kinds if latency_rounds else []:  # --latency-rounds 0: throughput only
            runs = [r[kind] for r in latency_rounds]
            results["latency_pinned_one_core"][kind] = {
                "p50_us": statistics.median(run["p50_us"] for run in runs),
                "p99_us": statistics.median(run["p99_us"] for run in runs),
                "p50_runs": [run["p50_us"] for run in runs],
                "lost": sum(args.latency_events - run["received"] for run in runs),
            }
    results["rounds"] = rounds
    results["latency_rounds"] = latency_rounds
    ratios = {}
    for name, (ours, peer) in RATIOS.items():
        if ours not in kinds or peer not in kinds:
            continue
        per_round = [r[ours]["rate"] / r[peer]["rate"] for r in rounds]

        def latency_ratio(quantile: str, ours: str = ours, peer: str = peer) -> float | None:
            if not latency_rounds:
                return None
            return float(
                round(statistics.median(r[ours][quantile] / r[peer][quantile] for r in latency_rounds), 2)
            )

        ratios[name] = {
            "throughput_ratio": round(statistics.median(per_round), 2),
            "sub_cpu_per_event_ratio": round(
                results["throughput"][ours]["sub_cpu_us_per_event"]
                / results["throughput"][peer]["sub_cpu_us_per_event"],
                2,
            ),
            "p50_latency_ratio": latency_ratio("p50_us"),
            "p99_latency_ratio": latency_ratio("p99_us"),
        }
        r = ratios[name]
        print(
            f"{name}: throughput {r['throughput_ratio']}x, subscriber CPU per event "
            f"{r['sub_cpu_per_event_ratio']}x, p50 latency {r['p50_latency_ratio']}x, "
            f"p99 {r['p99_latency_ratio']}x (medians of per-round ratios)"
        )
    results["ratios"] = ratios
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        child(sys.argv[1:])
    else:
        main()
