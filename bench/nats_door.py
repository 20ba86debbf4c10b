"""The NATS door: the same nats-py client against a three-server nats-server cluster and against a
three-node mesh cluster's NATS doors (``serve --nats-port``), in the same run.

    python bench/nats_door.py                   # results to bench/results/nats_door.json
    python bench/nats_door.py --events 100000 --repeat 5

- cross-node throughput: a nats-py publisher on the first server/node, a nats-py subscriber on the
  second, 100-byte events; the subscriber's rate from its first event to its last (separate
  processes, bench/mesh.py's children), rounds interleaving the two kinds; the ratio is the median of
  the rounds' ratios;
- latency: publish-to-receive (wall clock, same host) at a paced rate;
- the JavaScript client (npm ``nats`` under Node, ``make .node-nats``): one Node process, a
  publisher connection to the first server/node and a subscriber connection to the second; the
  subscriber's rate from its first event to its last; plain PUBs, then (``javascript_headers``) HPUBs,
  each with a one-header block (``Seq``).

Each throughput run also reports the CPU time the two servers (and, for nats-py, the two clients)
spent per event.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from harness import add_out, median_ratio, write_results
from mesh import cpu_seconds, run_pair

NODE_MODULES = Path(__file__).resolve().parent.parent / ".node-nats" / "node_modules"
JS_BENCH = """
const { connect, headers } = require("nats");
(async () => {
  const [pubUrl, subUrl, count] = [process.argv[2], process.argv[3], Number(process.argv[4])];
  let options;
  if (process.argv[5] === "headers") { options = { headers: headers() }; options.headers.set("Seq", "1"); }
  const pub = await connect({ servers: pubUrl });
  const sub = await connect({ servers: subUrl });
  let warm = false, got = 0, first = 0, last = 0;
  const done = new Promise((resolve) => {
    sub.subscribe("bench.door.js", { callback: (err, m) => {
      if (m.data.length === 4) { warm = true; return; }
      const now = process.hrtime.bigint();
      if (!got) first = now;
      last = now;
      if (++got === count) resolve();
    } });
  });
  await sub.flush();
  while (!warm) { pub.publish("bench.door.js", new Uint8Array(4)); await pub.flush(); }
  const body = new Uint8Array(100);
  for (let i = 0; i < count; i++) {
    pub.publish("bench.door.js", body, options);
    if (i % 1000 === 999) await pub.flush();
  }
  await pub.flush();
  let timer;  // cleared: a pending timer kept Node (and the run) alive for its whole 60 s
  await Promise.race([done, new Promise((r) => { timer = setTimeout(r, 60000); })]);
  clearTimeout(timer);
  const seconds = Number(last - first) / 1e9;
  console.log(JSON.stringify({ received: got, seconds, rate: Math.round(got / Math.max(seconds, 1e-9)) }));
  await pub.close(); await sub.close();
})();
"""


def js_run(
    pub_url: str, sub_url: str, events: int, headers: bool = False, server_pids: tuple[int, ...] = ()
) -> dict[str, Any]:
    """One Node process: the JavaScript client publishing on one server (HPUBs with ``headers``),
    subscribed on the other; with ``server_pids``, the CPU time the servers spent per event."""
    node = shutil.which("node")
    if node is None or not (NODE_MODULES / "nats").is_dir():
        raise SystemExit("the JavaScript client is missing: make .node-nats")
    before = sum(map(cpu_seconds, server_pids))
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "bench.js"
        script.write_text(JS_BENCH)
        out = subprocess.run(
            [node, str(script), pub_url, sub_url, str(events), "headers" if headers else "plain"],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            env={**os.environ, "NODE_PATH": str(NODE_MODULES)},
        )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if server_pids:
        spent = sum(map(cpu_seconds, server_pids)) - before
        result["servers_cpu_us_per_event"] = round(spent * 1e6 / events, 2)
    return result


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

    steps = Steps(6 * args.repeat + 2)

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
            js_runs: dict[str, dict[str, list[dict[str, Any]]]] = {
                variant: {kind: [] for kind in urls} for variant in ("plain", "headers")
            }
            for variant, kinds in js_runs.items():
                for _ in range(args.repeat):
                    for kind, (a, b) in urls.items():
                        run = js_run(a, b, args.events, variant == "headers", pids[kind])
                        kinds[kind].append(run)
                        print(
                            f"{kind:11} A->B JavaScript client, {variant:7} {run['rate']:>9,} events/s  "
                            f"CPU per event: servers {run['servers_cpu_us_per_event']} us"
                        )
                        steps.step(f"{kind} JavaScript throughput ({variant})")
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
    js_rates = {
        variant: {kind: [r["rate"] for r in kind_runs] for kind, kind_runs in kinds.items()}
        for variant, kinds in js_runs.items()
    }
    for variant, name in (("plain", "javascript_throughput"), ("headers", "javascript_headers_throughput")):
        results[name] = {
            kind: {"median_rate": statistics.median(js_rates[variant][kind]), "runs": kind_runs}
            for kind, kind_runs in js_runs[variant].items()
        }
    results["latency"] = latency
    results["ratio"] = {
        "throughput": ratio,
        "javascript_throughput": median_ratio(js_rates["plain"]["mesh"], js_rates["plain"]["nats-server"]),
        "javascript_headers_throughput": median_ratio(
            js_rates["headers"]["mesh"], js_rates["headers"]["nats-server"]
        ),
        "p50_latency": round(latency["mesh"]["p50_us"] / latency["nats-server"]["p50_us"], 2),
        "p99_latency": round(latency["mesh"]["p99_us"] / latency["nats-server"]["p99_us"], 2),
    }
    r = results["ratio"]
    print(
        f"mesh NATS door / nats-server cluster, nats-py cross-node: throughput {r['throughput']}x, "
        f"p50 latency {r['p50_latency']}x, p99 {r['p99_latency']}x; JavaScript client throughput "
        f"{r['javascript_throughput']}x, with headers {r['javascript_headers_throughput']}x"
    )
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
