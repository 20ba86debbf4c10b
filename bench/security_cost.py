"""What encryption and authentication cost: each path plain and secured, in interleaved rounds of one run.

- ZeroMQ direct, meshplane publisher and subscriber processes: plain vs CURVE (MESHPLANE_ZMQ_CURVE_*).
- NATS, meshplane processes against a nats-server: plain vs TLS (tls://, MESHPLANE_NATS_TLS_CA).
- The streams server: HTTP vs HTTPS (--tls-cert/--tls-key), publishes in batches of 1000.

    python bench/security_cost.py [--events 300000] [--rounds 3]     # results to bench/results/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trustme
import zmq.auth

from harness import write_results

sys.path.insert(0, str(Path(__file__).parent))
from event_plane import run_pair
from meshplane.cli.bench import Steps
from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.streams.client import StreamsClient


def curve_env(folder: Path) -> dict[str, str]:
    if not (folder / "plane.key_secret").exists():
        folder.mkdir(parents=True, exist_ok=True)
        zmq.auth.create_certificates(folder, "plane")
        (folder / "allowed").mkdir()
        shutil.copy(folder / "plane.key", folder / "allowed")
    return {
        **os.environ,
        "MESHPLANE_ZMQ_CURVE_CERT": str(folder / "plane.key_secret"),
        "MESHPLANE_ZMQ_CURVE_ALLOWED": str(folder / "allowed"),
    }


async def streams_publish(url: str, events: int, tls: ssl.SSLContext | None) -> float:
    batch = [{"event_type": "e", "data": "x" * 80} for _ in range(1000)]
    async with StreamsClient(url, tls=tls) as client:
        name = f"bench-{time.time_ns()}"
        await client.create_topic(name, 1)
        started = time.perf_counter()
        for _ in range(events // 1000):
            await client.publish_batch(name, batch)
        return events / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {}
    steps = Steps(6 * args.rounds)

    def record(name: str, rate: float) -> None:
        rates.setdefault(name, []).append(rate)
        steps.step(f"{name}, round {len(rates[name])}/{args.rounds}")
        print(f"  {name}: {rate:,.0f} events/s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        secured_zmq = curve_env(folder / "curve")
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(folder / "ca.pem"))
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(str(folder / "key.pem"))
        cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
        tls_files = ("--tls-cert", str(folder / "cert.pem"), "--tls-key", str(folder / "key.pem"))
        client_tls = ssl.create_default_context(cafile=str(folder / "ca.pem"))
        secured_nats = {**os.environ, "MESHPLANE_NATS_TLS_CA": str(folder / "ca.pem")}
        with (
            NatsServer() as plain_nats,
            NatsServer(tls=(folder / "cert.pem", folder / "key.pem", None)) as tls_nats,
            StreamsServerProcess(extra_args=("--fsync", "never")) as http,
            StreamsServerProcess(extra_args=("--fsync", "never", *tls_files)) as https,
        ):
            for server in (plain_nats, tls_nats, http, https):
                server.start()
            for n in range(args.rounds):
                print(f"round {n + 1}", flush=True)
                record(
                    "zmq_plain",
                    run_pair("zmq-meshplane", args.events, False, 0, "", dict(os.environ))["rate"],
                )
                record("zmq_curve", run_pair("zmq-meshplane", args.events, False, 0, "", secured_zmq)["rate"])
                record(
                    "nats_plain", run_pair("nats-meshplane", args.events, False, 0, plain_nats.url)["rate"]
                )
                record(
                    "nats_tls",
                    run_pair("nats-meshplane", args.events, False, 0, tls_nats.url, secured_nats)["rate"],
                )
                record("streams_http", asyncio.run(streams_publish(http.url, args.events, None)))
                record("streams_https", asyncio.run(streams_publish(https.url, args.events, client_tls)))
    medians = {name: round(statistics.median(values)) for name, values in rates.items()}
    # This VM's speed drifts within a run: each round's secured/plain ratio, then their median.
    ratios = {
        f"{secured}_vs_{plain}": round(
            statistics.median(s / p for s, p in zip(rates[secured], rates[plain], strict=True)), 3
        )
        for secured, plain in (
            ("zmq_curve", "zmq_plain"),
            ("nats_tls", "nats_plain"),
            ("streams_https", "streams_http"),
        )
    }
    result: dict[str, Any] = {
        "events": args.events,
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "median_events_per_s": medians,
        "ratios": ratios,
        "rounds_events_per_s": {k: [round(v) for v in vs] for k, vs in rates.items()},
    }
    out = Path(__file__).parent / "results" / "security_cost.json"
    write_results(out, result)
    print(json.dumps({"median_events_per_s": medians, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
