"""``meshplane up``: a whole local event plane in one command, with demo traffic and a live view."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from meshplane.broker import Broker
from meshplane.cli.options import add_token_option
from meshplane.cli.up_cluster import REPLICAS, SYNC_INTERVAL, start_cluster, start_second_server
from meshplane.cli.up_mesh import mesh_summary, publisher_configs, start_mesh
from meshplane.cli.up_next_steps import (
    DEMO_PARTITIONS,
    DEMO_SCOPE,
    DEMO_STREAM_TOPIC,
    DEMO_TOPIC,
    DEMO_WINDOWS_TOPIC,
    print_next_steps,
)
from meshplane.cli.up_pipeline import PIPELINE_PID_FILE, PipelineSupervisor, pipeline_holder
from meshplane.cli.up_state import (
    RUNNING_FILE,
    RunState,
    context_values,
    drop_context,
    lock_state_dir,
    save_context,
)
from meshplane.config import PlaneConfig
from meshplane.core.brokers import BROKERS_BUCKET, broker_record
from meshplane.core.records import new_instance_id
from meshplane.core.streamlog import StoredEvent
from meshplane.core.urls import redact_url
from meshplane.discovery.base import Discovery
from meshplane.errors import ConfigError
from meshplane.launchers import JetStreamCluster, NatsServer
from meshplane.plane import EventPlane
from meshplane.publisher import EventPublisher
from meshplane.streams.access import Tokens
from meshplane.streams.grants import ADMIN
from meshplane.streams.lock import DataDirLock
from meshplane.streams.service import StreamsConfig, StreamsService
from meshplane.subscriber import EventSubscriber


def add_up_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=["nats", "zmq"],
        default=os.environ.get("DYN_EVENT_PLANE", "nats"),
        help="transport of the demo: nats (embedded nats-server) or zmq (direct). Default nats",
    )
    parser.add_argument(
        "--nats-server", metavar="URL", help="use this NATS server instead of starting an embedded one"
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=0,
        metavar="N",
        help="with --transport zmq: start N brokers and run in broker mode through them (default 0: direct)",
    )
    add_token_option(
        parser,
        "MESHPLANE_TOKEN",
        "require this token from clients of the embedded nats-server (which put it in NATS_SERVER as "
        "nats://TOKEN@host:port) and of the streams server. Default: no token",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".meshplane"),
        metavar="DIR",
        help="folder for file discovery and server state (default ./.meshplane)",
    )
    parser.add_argument(
        "--streams-port",
        type=int,
        default=15500,
        metavar="PORT",
        help="port of the embedded streams server (default 15500, a free one if taken; -1: no streams). "
        f"Demo events are also appended to the partitioned topic {DEMO_STREAM_TOPIC!r}",
    )
    parser.add_argument(
        "--context",
        default="local",
        metavar="NAME",
        help="save this run's endpoints as context NAME (NAME-2, ... while another running `up` holds NAME) "
        "and select it while it runs unless another run's is selected, so that commands in other shells "
        "need no variables; on exit the previous selection comes back (default local; none: do not)",
    )
    parser.add_argument(
        "--nats-port",
        type=int,
        default=4222,
        metavar="PORT",
        help="port of the embedded nats-server (default 4222, a free one if taken)",
    )
    parser.add_argument(
        "--pipeline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the Spark pipeline on the demo topic (`meshplane pipeline demo --follow`: windowed "
        f"counts land in topic {DEMO_WINDOWS_TOPIC!r}); it needs the spark extra and Java, and is "
        "skipped, saying why, without them. --no-pipeline: a light run",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=0,
        metavar="N",
        help="run the demo through an event mesh of N local nodes (DYN_EVENT_PLANE=mesh): publishers spread "
        "over them, the subscriber on the last; `meshplane mesh status` shows the links (default 0: no mesh)",
    )
    parser.add_argument(
        "--cluster",
        type=int,
        choices=(3, 5),
        metavar="N",
        help="run a local N-node (3 or 5) nats-server cluster with JetStream instead of one nats-server: "
        "the event plane connects to every node, and the streams' topics and groups are replicated "
        "on it (R3) and served by two streams servers",
    )
    parser.add_argument("--publishers", type=int, default=3, metavar="N", help="demo publishers (default 3)")
    parser.add_argument(
        "--rate",
        type=float,
        default=200.0,
        metavar="R",
        help="events per second of each demo publisher (default 200)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between status lines (default 1)"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=0.0,
        metavar="S",
        help="stop after S seconds of demo traffic (default: run until Ctrl-C)",
    )


async def _demo_publisher(pub: EventPublisher, worker: int, rate: float, stop: asyncio.Event) -> None:
    interval = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        await pub.publish({"worker": worker, "event": "stored", "block_hashes": [pub.next_sequence, worker]})
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()


def _pipeline_missing(streams: _Streams | None) -> str | None:
    """Why the Spark pipeline cannot run here, or None."""
    if streams is None:
        return "it reads the streams server, which --streams-port -1 turned off"
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed: pip install 'meshplane[spark]'"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java: install a Java 17 runtime (make java)"
    return None


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def run_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - start-up, before any traffic
    run_lock = lock_state_dir(state_dir)
    nats_server: NatsServer | None = None
    nats_url = args.nats_server
    mesh = start_mesh(args.nodes, state_dir) if args.nodes else None
    if mesh is not None:
        args.transport = "mesh"
    if args.cluster and (args.nats_server or mesh is not None):
        raise ConfigError("--cluster starts its own nats-servers: not with --nats-server or --nodes")
    cluster = start_cluster(args.cluster, args.token) if args.cluster else None
    if cluster is not None and args.transport == "nats":
        nats_url = ",".join(cluster.urls)
    if args.transport == "nats" and not nats_url:
        nats_server = NatsServer(port=args.nats_port if _port_free(args.nats_port) else 0, token=args.token)
        nats_server.start()
        nats_url = nats_server.url
    brokers = [
        Broker("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0") for _ in range(args.brokers)
    ]
    if brokers and args.transport != "zmq":
        raise ConfigError("--brokers needs --transport zmq")
    addresses = tuple(b.start() for b in brokers)
    config = PlaneConfig.from_env(
        event_plane=args.transport,
        discovery_backend="file",
        file_kv=state_dir / "kv",
        nats_server=nats_url,
        zmq_brokers=addresses or None,
        mesh_node=mesh.nodes[-1].route_url if mesh is not None else None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    print(f"meshplane up: transport={config.event_plane} discovery=file:{config.file_kv}", flush=True)
    shown_url = redact_url(nats_url) if nats_url else None
    if nats_server is not None:
        print(f"  embedded nats-server pid {nats_server.pid} at {shown_url}", flush=True)
    for address in addresses:
        print(f"  broker: xsub {address.xsub}, xpub {address.xpub}", flush=True)
    for node_id, node in zip(mesh.ids if mesh else (), mesh.nodes if mesh else (), strict=True):
        print(f"  mesh node {node_id}: pid {node.pid}, {node.url}, routes at {node.route_url}", flush=True)
    for cluster_node in cluster.nodes if cluster is not None else ():
        shown = redact_url(cluster_node.url)
        print(f"  nats-server {cluster_node.name} (JetStream): pid {cluster_node.pid} at {shown}", flush=True)
    streams = await _start_streams(args, state_dir, config, cluster) if args.streams_port >= 0 else None
    second = start_second_server(cluster, state_dir, args.token) if cluster and streams else None
    run = RunState(state_dir, f"{streams.url}/ui" if streams is not None else None, mesh)
    run.write()
    if streams is not None:
        where = (
            f"JetStream R{REPLICAS}, fsync {SYNC_INTERVAL}"
            if cluster is not None
            else f"data in {state_dir / 'streams'}"
        )
        print(f"  streams server at {streams.url} ({where})", flush=True)
        if second is not None:
            print(f"  streams server at {second.url} (pid {second.pid}: the same topics, groups)", flush=True)
        print(f"  dashboard at {streams.url}/ui", flush=True)
    mesh_url = mesh.nodes[0].url if mesh is not None else None
    streams_url = streams.url if streams is not None else None
    variables = context_values(args, config, nats_url, streams_url, mesh_url)
    local = save_context(args, variables)
    missing = _pipeline_missing(streams) if args.pipeline else None
    holder = pipeline_holder(state_dir / PIPELINE_PID_FILE) if args.pipeline else None
    if holder is not None and not missing:
        missing = (
            f"a pipeline from an earlier run, pid {holder}, still holds its checkpoint in {state_dir}: "
            f"stop it (kill -- -{holder}) and run again"
        )
    print_next_steps(variables, local, args.pipeline and not missing)
    pipeline = None
    if missing:
        print(f"  Spark pipeline: not started ({missing})", flush=True)
    elif args.pipeline and streams is not None:
        print(
            f"  Spark pipeline: starting (its first windows reach topic {DEMO_WINDOWS_TOPIC!r} in ~20-40 s; "
            f"log in {state_dir / 'pipeline.log'}; --no-pipeline for a light run)",
            flush=True,
        )
        (state_dir / "pipeline.log").unlink(missing_ok=True)
        argv = [sys.executable, "-m", "meshplane.cli.main", "pipeline", "demo", "--url", streams.url]
        argv += ["--source", DEMO_STREAM_TOPIC, "--state-dir", str(state_dir)]
        pipeline = PipelineSupervisor(
            [*argv, "--follow", str(args.duration or 10**9)],
            state_dir / "pipeline.log",
            pid_file=state_dir / PIPELINE_PID_FILE,
        )
        await pipeline.start()
    run.pipeline = pipeline
    run.write()

    try:
        async with contextlib.AsyncExitStack() as stack:
            plane = await stack.enter_async_context(EventPlane(config))
            for broker, address in zip(brokers, addresses, strict=True):
                # so that other shells find them (DYN_ZMQ_BROKER_ENABLED=true), and the dashboard
                broker_id = new_instance_id()
                record = broker_record(broker_id, address, broker.stats_endpoint)
                await (await plane.discovery()).register(f"{BROKERS_BUCKET}/{broker_id:x}", record)
            subscriber = await EventSubscriber.create(DEMO_SCOPE, DEMO_TOPIC, plane=plane)
            if mesh is not None:  # each publisher on its own plane, on the next node in turn
                planes = [EventPlane(c) for c in publisher_configs(mesh, config, args.publishers)]
                stack.push_async_callback(_close_all, planes)
                publishers = [await EventPublisher.create(DEMO_SCOPE, DEMO_TOPIC, plane=p) for p in planes]
            else:
                publishers = [
                    await EventPublisher.create(DEMO_SCOPE, DEMO_TOPIC, plane=plane)
                    for _ in range(args.publishers)
                ]
            if config.event_plane == "zmq":
                for pub in publishers:
                    await pub.wait_for_subscribers(max(1, len(addresses)), timeout=10)
            if args.duration:  # seconds of traffic: a slow start (a loaded machine) does not eat them
                loop.call_later(args.duration, stop.set)
            tasks = [
                asyncio.create_task(_demo_publisher(p, i, args.rate, stop)) for i, p in enumerate(publishers)
            ]
            tasks.append(asyncio.create_task(_consume(subscriber, streams)))
            try:
                await _report(subscriber, args.interval, stop, streams, run)
            finally:  # stop the traffic before the plane closes what it flows through
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            stats = subscriber.stats
            print(
                f"\nstopped: {stats.received} events received from {len(publishers)} publishers, "
                f"gaps {stats.gaps}, malformed {stats.malformed_total}",
                flush=True,
            )
    finally:
        if local is not None:
            drop_context(local[0])
        if pipeline is not None:
            await pipeline.stop()
        if second is not None:
            second.cleanup()
        if streams is not None:
            await streams.close()
        for broker in brokers:
            broker.stop()
        if nats_server is not None:
            nats_server.cleanup()
        if mesh is not None:
            mesh.cleanup()
        if cluster is not None:
            cluster.cleanup()
        (state_dir / RUNNING_FILE).unlink(missing_ok=True)
        run_lock.release()  # the last: the folder is free once everything in it has stopped
    return 0


async def _close_all(planes: list[EventPlane]) -> None:
    for plane in planes:
        await plane.close()


class _Streams:
    """The embedded streams server of `up`, run on this loop."""

    def __init__(
        self,
        engine: StreamsService,
        task: asyncio.Task[None],
        stop: asyncio.Event,
        url: str,
        discovery: Discovery,
    ) -> None:
        self.engine, self.task, self.stop, self.url = engine, task, stop, url
        self.discovery = discovery

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.discovery.close()


async def _start_streams(
    args: argparse.Namespace, state_dir: Path, config: PlaneConfig, cluster: JetStreamCluster | None
) -> _Streams:
    from meshplane.discovery import create_discovery
    from meshplane.streams.http.app import serve
    from meshplane.streams.jetstream.service import JetStreamStreamsService

    tokens = Tokens({args.token: ADMIN}) if args.token else None
    if cluster is None:  # the data directory's own lock, as `serve` takes it (a `serve` may hold it)
        DataDirLock(state_dir / "streams").acquire()
    discovery = create_discovery(config)  # the dashboard's event plane page reads it
    for port in (args.streams_port, 0):
        streams_config = StreamsConfig(data_dir=state_dir / "streams")
        engine = (
            JetStreamStreamsService(streams_config, cluster.urls, replicas=REPLICAS)
            if cluster is not None
            else StreamsService(streams_config)
        )
        stop = asyncio.Event()
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            serve(
                engine,
                "127.0.0.1",
                port,
                tokens=tokens,
                on_ready=ready.set_result,
                stop=stop,
                discovery=discovery,
            )
        )
        waiting: set[asyncio.Future[Any]] = {task, ready}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            if DEMO_STREAM_TOPIC not in engine.topics:
                await engine.create_topic(DEMO_STREAM_TOPIC, num_partitions=DEMO_PARTITIONS)
            return _Streams(engine, task, stop, f"http://127.0.0.1:{ready.result()}", discovery)
        error = task.exception()
        if not isinstance(error, OSError) or port == 0:
            raise ConfigError(f"the streams server did not start: {error}")
        print(f"  port {port} is taken: the streams server takes a free one", flush=True)
    raise AssertionError("unreachable")


async def _consume(subscriber: EventSubscriber, streams: _Streams | None) -> None:
    """Receive the demo events; with streams, append them to the demo topic keyed by worker."""
    async for envelope in subscriber:
        if streams is None:
            continue
        try:
            data = msgspec.msgpack.decode(envelope.payload)
        except msgspec.DecodeError:
            data = envelope.payload
        worker = data.get("worker") if isinstance(data, dict) else None
        event = StoredEvent(f"{envelope.publisher_id:x}-{envelope.sequence}", "demo", data, str(worker))
        # worker N in partition N: keys hashed over 4 partitions left partitions 0 and 2 empty
        partition = worker % DEMO_PARTITIONS if isinstance(worker, int) else None
        await streams.engine.publish_topic(DEMO_STREAM_TOPIC, [event], partition)


def _stored(streams: _Streams, topic: str) -> int:
    found = streams.engine.topics.get(topic)
    return sum(p.next_offset for p in found.partitions) if found is not None else 0


async def _report(
    subscriber: EventSubscriber, interval: float, stop: asyncio.Event, streams: _Streams | None, run: RunState
) -> None:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as http:
        await _report_lines(subscriber, interval, stop, streams, run, http)


async def _report_lines(
    subscriber: EventSubscriber,
    interval: float,
    stop: asyncio.Event,
    streams: _Streams | None,
    run: RunState,
    http: Any,
) -> None:
    started = last_at = time.monotonic()
    last_received = 0
    tty = sys.stdout.isatty()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await stop.wait()
        now = time.monotonic()
        stats = subscriber.stats
        rate = (stats.received - last_received) / max(now - last_at, 1e-9)
        last_received, last_at = stats.received, now
        heard = f"publishers heard {stats.publishers_heard}"
        if subscriber.uses_discovery:
            heard += f" (in discovery {stats.publishers_discovered})"
        fields = [
            f"up {now - started:6.1f}s",
            f"{rate:8.0f} events/s",
            heard,
            f"received {stats.received}",
            f"gaps {stats.gaps} (missing {stats.missing})",
        ]
        if run.pipeline is not None and streams is not None:
            fields.append(f"{run.pipeline.health.summary()}, windows {_stored(streams, DEMO_WINDOWS_TOPIC)}")
        if run.mesh is not None:
            fields.append(await mesh_summary(run.mesh, http))
        if streams is not None:
            fields.append(f"stored in {DEMO_STREAM_TOPIC} {_stored(streams, DEMO_STREAM_TOPIC)}")
        fields += [f"malformed {stats.malformed_total}", f"timeouts {stats.timeouts}"]
        run.write()
        if stats.duplicates_dropped:  # each event comes once through every broker: expected, not loss
            fields.append(f"duplicate copies removed {stats.duplicates_dropped}")
        if tty:  # one line rewritten in place: it must fit, or each rewrite piles up below the last
            line = fit(fields, shutil.get_terminal_size().columns - 1)
            print(f"\r{line}\x1b[K", end="", flush=True)
        else:
            print(" | ".join(fields), flush=True)


def fit(fields: list[str], width: int) -> str:
    """The fields, most important first, that fit in ``width`` columns (the first one cut if need be)."""
    line = fields[0][:width]
    for field in fields[1:]:
        if len(line) + 3 + len(field) > width:
            break
        line += " | " + field
    return line
