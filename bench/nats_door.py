"""The NATS door: the same nats-py client against a three-server nats-server cluster and against a
three-node mesh cluster's NATS doors (``serve --nats-port``), in the same run.

    python bench/nats_door.py                   # results to bench/results/nats_door.json
    python bench/nats_door.py --events 100000 --repeat 5

- cross-node throughput: a nats-py publisher on the first server/node, a nats-py subscriber on the
  second, 100-byte events; the subscriber's rate from its first event to its last (separate
  processes, bench/mesh.py's children), rounds interleaving the two kinds; the ratio is the median of
  the rounds' ratios;
- latency: publish-to-receive (wall clock, same host) at a paced rate.

Each throughput run also reports the CPU time the two servers and the two clients spent per event.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from typing import Any

from harness import add_out, median_ratio, write_results
from mesh import run_pair


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000, help="events per throughput run")
    parser.add_argument("--latency-events", type=int, default=3_000, help="events per latency run")
    parser.add_argument("--interval", type=float, default=0.0005, help="seconds between latency-run events")
    parser.add_argument("--repeat", type=int, default=3, help="throughput rounds (each runs both kinds)")
    add_out(parser, "nats_door")
    args = parser.parse_args()

    from meshplane.cli.bench import Steps
    from meshplane.launchers import MeshCluster, NatsServer, free_port

    steps = Steps(2 * args.repeat + 2)

    route_ports = [free_port() for _ in range(3)]
    servers = [
        NatsServer(cluster=("bench", port, tuple(p for p in route_ports if p != port)))
        for port in route_ports
    ]
    door_ports = {node: free_port() for node in "abc"}
    node_args: dict[str, tuple[str, ...]] = {node: ("--nats-port", str(p)) for node, p in door_ports.items()}
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "payload_bytes": 100,
        "client": "nats-py, the same for both",
    }
    with MeshCluster(3, heartbeat_interval=1.0, node_args=node_args) as cluster:
        try:
            for server in servers:
                server.start()
            cluster.start().wait_linked()
            urls = {
                "nats-server": (servers[0].url, servers[1].url),
                "mesh": (f"nats://127.0.0.1:{door_ports['a']}", f"nats://127.0.0.1:{door_ports['b']}"),
            }
            pids = {
                "nats-server": (servers[0].pid, servers[1].pid),
                "mesh": (cluster["a"].pid, cluster["b"].pid),
            }
            runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in urls}
            for _ in range(args.repeat):
                for kind, (a, b) in urls.items():
                    run = run_pair("nats", a, b, args.events, False, 0.0, server_pids=pids[kind])
                    runs[kind].append(run)
                    print(
                        f"{kind:11} A->B {run['rate']:>9,} events/s  "
                        f"CPU per event: servers {run['cpu_us_per_event']['servers']} us"
                    )
                    steps.step(f"{kind} throughput")
            latency = {}
            for kind, (a, b) in urls.items():
                latency[kind] = run_pair("nats", a, b, args.latency_events, True, args.interval)
                lat = latency[kind]
                print(f"{kind:11} A->B latency p50 {lat['p50_us']} us  p99 {lat['p99_us']} us")
                steps.step(f"{kind} latency")
        finally:
            for server in servers:
                server.cleanup()
    rates = {kind: [r["rate"] for r in kind_runs] for kind, kind_runs in runs.items()}
    ratio = median_ratio(rates["mesh"], rates["nats-server"])
    results["throughput"] = {
        kind: {"median_rate": statistics.median(rates[kind]), "runs": kind_runs}
        for kind, kind_runs in runs.items()
    }
    results["latency"] = latency
    results["ratio"] = {
        "throughput": ratio,
        "p50_latency": round(latency["mesh"]["p50_us"] / latency["nats-server"]["p50_us"], 2),
        "p99_latency": round(latency["mesh"]["p99_us"] / latency["nats-server"]["p99_us"], 2),
    }
    r = results["ratio"]
    print(
        f"mesh NATS door / nats-server cluster, nats-py cross-node: throughput {r['throughput']}x, "
        f"p50 latency {r['p50_latency']}x, p99 {r['p99_latency']}x"
    )
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
