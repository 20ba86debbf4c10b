"""Broker-mode benchmark: direct, 1 broker, 2 brokers with dedup, and raw pyzmq through a plain zmq.proxy.

Same processes and payloads as bench/event_plane.py (100 bytes, Dynamo layout), plus the relays as
processes of their own. Also counts TCP connections for P publishers x S subscribers in direct and
broker mode (the seed claims O(P x S) against O(P + S)).

    python bench/broker_mode.py [--events 300000] [--latency-events 5000]

The broker cases run with both relays: c (the default: libzmq's proxy moves the events) and python
(`--relay python`, exact message counters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import zmq

from harness import add_out, write_results

sys.path.insert(0, str(Path(__file__).parent))
from event_plane import run_pair
from meshplane.broker import query_stats
from meshplane.cli.bench import Steps
from meshplane.launchers import BrokerProcess


def proxy_child() -> None:
    """A plain zmq.proxy: the raw peer's relay, as fast as pyzmq can relay (C loop, no counters)."""
    ctx = zmq.Context()
    xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    xsub.setsockopt(zmq.RCVHWM, 100_000)
    xpub.setsockopt(zmq.SNDHWM, 100_000)
    xsub.bind("tcp://127.0.0.1:*")
    xpub.bind("tcp://127.0.0.1:*")
    print(
        json.dumps(
            {
                "xsub": xsub.getsockopt_string(zmq.LAST_ENDPOINT),
                "xpub": xpub.getsockopt_string(zmq.LAST_ENDPOINT),
            }
        ),
        flush=True,
    )
    zmq.proxy(xsub, xpub)


def start_proxy(pin: bool) -> tuple[subprocess.Popen[str], tuple[str, str]]:
    prefix = ["taskset", "-c", "0"] if pin and shutil.which("taskset") else []
    proc = subprocess.Popen([*prefix, sys.executable, __file__, "_proxy"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    return proc, (ready["xsub"], ready["xpub"])


def broker_env(brokers: list[BrokerProcess]) -> dict[str, str]:
    url = f"xsub={';'.join(b.xsub for b in brokers)} , xpub={';'.join(b.xpub for b in brokers)}"
    return {**os.environ, "DYN_ZMQ_BROKER_URL": url}


def run_case(case: str, events: int, latency: bool, interval: float) -> dict[str, Any]:
    if case == "raw-zmq-proxy":
        proc, endpoints = start_proxy(latency)
        try:
            return run_pair("zmq-raw", events, latency, interval, "", proxy=endpoints)
        finally:
            proc.kill()
            proc.wait()
    if case == "meshplane-direct":
        return run_pair("zmq-meshplane", events, latency, interval, "")
    count = 2 if case.startswith("meshplane-2-brokers") else 1
    relay = ("--relay", "c" if case.endswith("-c") else "python")
    # Pinned like the raw proxy and the peers in latency runs: a hop to an idle vCPU costs a VM wake-up.
    launcher = ("taskset", "-c", "0") if latency and shutil.which("taskset") else ()
    brokers = [BrokerProcess(extra_args=("--no-register", *relay), launcher=launcher) for _ in range(count)]
    try:
        for broker in brokers:
            broker.start()
        result = run_pair("zmq-meshplane", events, latency, interval, "", env=broker_env(brokers))
        result["broker_dropped"] = sum(query_stats(b.stats_endpoint)["dropped"] for b in brokers)
        return result
    finally:
        for broker in brokers:
            broker.cleanup()


def established_connections() -> int:
    """Established TCP connections on this host (both ends of a loopback connection count once each)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            count += sum(1 for line in f.readlines()[1:] if line.split()[3] == "01")
    return count


async def connection_count(publishers: int, subscribers: int, brokers: list[BrokerProcess]) -> int:
    """Connections opened by P publishers and S subscribers of one topic (publishers wait for all)."""
    from meshplane import EventPlane, PlaneConfig, Scope

    with tempfile.TemporaryDirectory() as kv:
        config = PlaneConfig.from_env(
            {},
            event_plane="zmq",
            discovery_backend="file",
            file_kv=Path(kv),
            file_kv_poll_interval=0.02,
            zmq_brokers=tuple(b.address for b in brokers) or None,
        )
        before = established_connections()
        async with EventPlane(config) as plane:
            scope = Scope.namespace("sockets")
            pubs = [await plane.publisher(scope, "t") for _ in range(publishers)]
            subs = [await plane.subscriber(scope, "t") for _ in range(subscribers)]
            if brokers:
                # Through a broker a late publisher sees the subscriptions merged (XSUB replays each
                # topic once), so wait for the route, then for every peer's connection to the broker.
                await asyncio.gather(*(p.wait_for_subscribers(1, timeout=60) for p in pubs))
                expected = 2 * (publishers + subscribers) * len(brokers)
                for _ in range(300):
                    if established_connections() - before >= expected:
                        break
                    await asyncio.sleep(0.1)
            else:
                await asyncio.gather(*(p.wait_for_subscribers(subscribers, timeout=60) for p in pubs))
            opened = established_connections() - before
            del subs
        return opened // 2  # both ends of each loopback connection are on this host


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--latency-events", type=int, default=5_000)
    parser.add_argument("--interval", type=float, default=0.0005)
    add_out(parser, "broker_mode")
    args = parser.parse_args()
    cases = [
        "raw-zmq-proxy",
        "meshplane-direct",
        "meshplane-1-broker",
        "meshplane-1-broker-c",
        "meshplane-2-brokers",
        "meshplane-2-brokers-c",
    ]
    results: dict[str, Any] = {
        "events": args.events,
        "payload_bytes": 100,
        "throughput": {},
        "latency": {},
        "connections": {},
    }
    connection_shapes = ((10, 2), (20, 5), (40, 10))
    steps = Steps(2 * len(cases) + len(connection_shapes))
    for case in cases:
        result = run_case(case, args.events, False, 0.0)
        steps.step(f"{case} throughput")
        results["throughput"][case] = result
        print(
            f"{case:22} {result['rate']:>9,} events/s  received {result['received']:,}"
            f"  copies dropped {result.get('duplicates_dropped', 0):,}"
            f"  broker drops {result.get('broker_dropped', 0):,}"
        )
    for case in cases:
        result = run_case(case, args.latency_events, True, args.interval)
        steps.step(f"{case} latency")
        results["latency"][case] = result
        print(f"{case:22} latency p50 {result['p50_us']} us  p99 {result['p99_us']} us (one core)")
    for p, s in connection_shapes:
        direct = asyncio.run(connection_count(p, s, []))
        broker = BrokerProcess().start()
        try:
            brokered = asyncio.run(connection_count(p, s, [broker]))
        finally:
            broker.cleanup()
        results["connections"][f"{p}x{s}"] = {"direct": direct, "one_broker": brokered}
        steps.step(f"connections for {p}x{s}")
        print(f"connections for {p} publishers x {s} subscribers: direct {direct}, one broker {brokered}")
    t, lat = results["throughput"], results["latency"]
    results["ratios"] = {
        "one_broker_throughput_vs_raw_proxy": round(
            t["meshplane-1-broker"]["rate"] / t["raw-zmq-proxy"]["rate"], 2
        ),
        "two_brokers_throughput_vs_raw_proxy": round(
            t["meshplane-2-brokers"]["rate"] / t["raw-zmq-proxy"]["rate"], 2
        ),
        "one_broker_c_throughput_vs_raw_proxy": round(
            t["meshplane-1-broker-c"]["rate"] / t["raw-zmq-proxy"]["rate"], 2
        ),
        "two_brokers_c_throughput_vs_raw_proxy": round(
            t["meshplane-2-brokers-c"]["rate"] / t["raw-zmq-proxy"]["rate"], 2
        ),
        "one_broker_c_p50_vs_direct": round(
            lat["meshplane-1-broker-c"]["p50_us"] / lat["meshplane-direct"]["p50_us"], 2
        ),
        "one_broker_c_p99_vs_direct": round(
            lat["meshplane-1-broker-c"]["p99_us"] / lat["meshplane-direct"]["p99_us"], 2
        ),
        "one_broker_p50_vs_direct": round(
            lat["meshplane-1-broker"]["p50_us"] / lat["meshplane-direct"]["p50_us"], 2
        ),
        "one_broker_p99_vs_direct": round(
            lat["meshplane-1-broker"]["p99_us"] / lat["meshplane-direct"]["p99_us"], 2
        ),
    }
    print(json.dumps(results["ratios"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["_proxy"]:
        proxy_child()
    else:
        main()
