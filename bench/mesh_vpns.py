"""What Message VPNs cost the mesh (issue 58): two nodes, a publisher on A and a subscriber on B,
100-byte events, in the same run:

- the default VPN (today's deployments);
- one named VPN (its clients' subjects carry ``$vpn:A.``);
- two named VPNs at once, half the events each (a publisher and a subscriber per VPN).

For each: the subscribers' rate, the two nodes' CPU time per event (the median of ``--repeat``
runs), and the share of the events' two node hops (the publisher's read on a, the link's read on b)
that took the C direct path (``direct_path_events`` of ``GET /mesh``): a run whose share is low
went the Python path, most often because a subscriber fell behind on a loaded machine (a client with
events queued is no plain target). The ratios say what a second VPN costs against one, and what a
named VPN costs against the default. ``python bench/mesh_vpns.py`` writes bench/results/mesh_vpns.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from harness import add_out, machine, write_results
from mesh import _read, _spawn, children_cpu_seconds, cpu_seconds


def direct_events(urls: tuple[str, ...]) -> int:
    """The events the nodes at ``urls`` took on their direct path, all together."""
    total = 0
    for url in urls:
        with urllib.request.urlopen(f"{url}/mesh", timeout=30) as response:
            total += json.load(response)["counters"]["direct_path_events"]
    return total


def run_pairs(
    kinds: list[str], a: str, b: str, events: int, pids: tuple[int, ...], urls: tuple[str, ...]
) -> dict[str, Any]:
    """A publisher on ``a`` and a subscriber on ``b`` for each kind (``mesh@VPN``), all at once,
    ``events`` in all shared between them: their summed rate, the nodes' CPU per event and the
    share of the node hops the direct path took."""
    direct_before = direct_events(urls)
    servers_before, clients_before = sum(map(cpu_seconds, pids)), children_cpu_seconds()
    each = events // len(kinds)
    with tempfile.TemporaryDirectory() as folder:
        markers = [str(Path(folder) / f"warm-{i}") for i in range(len(kinds))]
        subs = [
            _spawn(["_sub", kind, b, str(each), "0", "1", marker])
            for kind, marker in zip(kinds, markers, strict=True)
        ]
        for sub in subs:
            _read(sub)  # ready
        pubs = [
            _spawn(["_pub", kind, a, str(each), "0", marker])
            for kind, marker in zip(kinds, markers, strict=True)
        ]
        results = [_read(sub) for sub in subs]
        for process in (*pubs, *subs):
            process.wait(300)
    servers = sum(map(cpu_seconds, pids)) - servers_before
    clients = children_cpu_seconds() - clients_before
    direct = direct_events(urls) - direct_before
    received = sum(r["received"] for r in results)
    return {
        "events": each * len(kinds),
        "received": received,
        "rate": round(sum(r["rate"] for r in results)),
        "servers_cpu_us_per_event": round(servers / received * 1e6, 3),
        "clients_cpu_us_per_event": round(clients / received * 1e6, 3),
        "direct_share": round(direct / (2 * each * len(kinds)), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000, help="events per run (shared by the VPNs)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the median is kept")
    add_out(parser, "mesh_vpns")
    args = parser.parse_args()

    from meshplane.launchers import MeshCluster

    rows = {"default": ["mesh"], "one_vpn": ["mesh@A"], "two_vpns": ["mesh@A", "mesh@B"]}
    results: dict[str, Any] = {
        "machine": machine(),
        "events": args.events,
        "payload_bytes": 100,
    }
    with tempfile.TemporaryDirectory() as folder:
        vpns = Path(folder) / "vpns.toml"
        vpns.write_text("[vpns.A]\n[vpns.B]\n")
        with MeshCluster(2, heartbeat_interval=1.0, extra_args=("--mesh-vpns", str(vpns))) as cluster:
            cluster.start().wait_linked()
            a, b = cluster["a"].route_url, cluster["b"].route_url
            pids = (cluster["a"].pid, cluster["b"].pid)
            urls = (cluster["a"].url, cluster["b"].url)
            runs: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
            for _ in range(args.repeat):  # interleaved: the machine's load touches every row alike
                for row, kinds in rows.items():
                    runs[row].append(run_pairs(kinds, a, b, args.events, pids, urls))
    for row, measured in runs.items():
        cpu = statistics.median(r["servers_cpu_us_per_event"] for r in measured)
        rate = statistics.median(r["rate"] for r in measured)
        share = statistics.median(r["direct_share"] for r in measured)
        spread = [
            min(r["servers_cpu_us_per_event"] for r in measured),
            max(r["servers_cpu_us_per_event"] for r in measured),
        ]
        results[row] = {
            "rate": rate,
            "servers_cpu_us_per_event": cpu,
            "servers_cpu_us_per_event_range": spread,
            "direct_share": share,
            "runs": measured,
        }
        print(
            f"{row:9} {rate:>10,.0f} events/s  nodes' CPU per event {cpu} us "
            f"(runs {spread[0]}-{spread[1]})  direct path {share:.0%}"
        )
    one, two, default = (
        results[row]["servers_cpu_us_per_event"] for row in ("one_vpn", "two_vpns", "default")
    )
    results["ratios"] = {
        "two_vpns_to_one_cpu": round(two / one, 3),
        "two_vpns_to_one_rate": round(results["two_vpns"]["rate"] / results["one_vpn"]["rate"], 3),
        "one_vpn_to_default_cpu": round(one / default, 3),
    }
    r = results["ratios"]
    print(
        f"two VPNs against one: CPU per event {r['two_vpns_to_one_cpu']}x, "
        f"rate {r['two_vpns_to_one_rate']}x; "
        f"a named VPN against the default: CPU per event {r['one_vpn_to_default_cpu']}x"
    )
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
