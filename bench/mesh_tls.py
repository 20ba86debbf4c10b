"""The cost of TLS on mesh links: two meshplane nodes linked in clear and two linked over TLS 1.3
(certificates from a CA made for the run, mutual, identities checked), clients on TLS too; the
cross-node throughput and latency of bench/mesh.py, both in the same run, and the ratios.

    python bench/mesh_tls.py                 # results to bench/results/mesh_tls.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trustme

from harness import add_out, write_results

sys.path.insert(0, str(Path(__file__).parent))
from mesh import run_pair
from meshplane.launchers import MeshCluster


def certificates(folder: Path) -> dict[str, tuple[str, ...]]:
    """A CA and node certificates for a and b (their ids and 127.0.0.1); serve's TLS flags per node."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    args: dict[str, tuple[str, ...]] = {}
    for name in ("a", "b", "client"):
        cert = ca.issue_cert(name, "127.0.0.1")
        cert.private_key_pem.write_to_path(str(folder / f"{name}.key"))
        cert.cert_chain_pems[0].write_to_path(str(folder / f"{name}.pem"))
        args[name] = (
            *("--mesh-tls-cert", str(folder / f"{name}.pem"), "--mesh-tls-key", str(folder / f"{name}.key")),
            *("--mesh-tls-ca", str(folder / "ca.pem")),
        )
    return args


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--latency-events", type=int, default=5_000)
    parser.add_argument("--interval", type=float, default=0.0005)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, plain then TLS")
    add_out(parser, "mesh_tls")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "tls": []}
    with tempfile.TemporaryDirectory() as folder:
        tls_args = certificates(Path(folder))
        client_env = {
            "MESHPLANE_MESH_TLS_CA": f"{folder}/ca.pem",
            "MESHPLANE_MESH_TLS_CERT": f"{folder}/client.pem",
            "MESHPLANE_MESH_TLS_KEY": f"{folder}/client.key",
        }
        node_args = {node: tls_args[node] for node in ("a", "b")}
        with (
            MeshCluster(2, heartbeat_interval=1.0) as plain,
            MeshCluster(2, heartbeat_interval=1.0, node_args=node_args) as secure,
        ):
            plain.start().wait_linked()
            secure.start().wait_linked()
            for _ in range(args.rounds):  # interleaved: both kinds see the same machine
                for kind, cluster in (("plain", plain), ("tls", secure)):
                    for name in client_env:
                        os.environ.pop(name, None)
                    if kind == "tls":
                        os.environ.update(client_env)
                    a, b = cluster["a"].route_url, cluster["b"].route_url
                    rate = run_pair("mesh", a, b, args.events, False, 0.0)["rate"]
                    latency = run_pair("mesh", a, b, args.latency_events, True, args.interval)
                    runs[kind].append(
                        {"rate": rate, "p50_us": latency["p50_us"], "p99_us": latency["p99_us"]}
                    )
    results: dict[str, Any] = {"events": args.events, "rounds": runs}
    for kind, measured in runs.items():
        results[kind] = {
            key: statistics.median(r[key] for r in measured) for key in ("rate", "p50_us", "p99_us")
        }

    def ratio(key: str) -> float:  # the median of the per-round ratios
        pairs = zip(runs["plain"], runs["tls"], strict=True)
        return round(float(statistics.median(t[key] / p[key] for p, t in pairs)), 2)

    results["ratios"] = {
        "throughput": ratio("rate"),
        "p50_latency": ratio("p50_us"),
        "p99_latency": ratio("p99_us"),
    }
    plain_run, tls_run = results["plain"], results["tls"]
    print(
        f"plain: {plain_run['rate']:,.0f} events/s, p50 {plain_run['p50_us']} us; "
        f"TLS: {tls_run['rate']:,.0f} events/s, p50 {tls_run['p50_us']} us; "
        f"TLS/plain throughput {results['ratios']['throughput']}x, "
        f"p50 latency {results['ratios']['p50_latency']}x"
    )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
