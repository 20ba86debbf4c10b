"""Matching under adversarial patterns: one client holds 10,000 patterns built to be expensive
(``*`` and one word over 31 tokens, then ``z``; some ending in ``#``), and every event is on a new
32-token subject, so no route is cached. Against nats-server holding the same subscriptions (``*``
and ``>``, NATS's spelling), in the same run.

    python bench/mesh_matching.py            # results to bench/results/mesh_matching.json

- the routing core alone: ``Router.route`` per new subject (median, p99);
- a real node: 20,000 events on new subjects from one client to an honest ``w.>`` subscriber while
  ``/health`` is polled every 5 ms (its p50 / p99), events per second end to end;
- nats-server: the same subscriptions and events through nats-py, events per second; the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from typing import Any

import aiohttp
import nats

from harness import add_out, write_results
from meshplane.core.mesh.router import Router
from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.mesh.client import MeshClient

TOKENS = 32


def adversarial_patterns(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    patterns: set[str] = set()
    while len(patterns) < count:
        body = ".".join(rng.choice(("*", "w")) for _ in range(TOKENS - 1))
        patterns.add(body + (".z" if rng.random() < 0.9 else ".>"))
    return sorted(patterns)


def new_subjects(count: int) -> list[str]:
    """Subjects no cache has seen; many match many patterns, some none."""
    return [".".join(["w"] * (TOKENS - 2) + [f"n{i}", "z" if i % 3 else f"y{i}"]) for i in range(count)]


def routing_core(patterns: list[str], subjects: list[str]) -> dict[str, Any]:
    router: Router[str] = Router()
    for pattern in patterns:
        router.subscribe("mallory", pattern)
    router.subscribe("honest", "w.>")
    times = []
    for subject in subjects:
        started = time.perf_counter()
        router.route(subject)
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "route_median_us": round(statistics.median(times) * 1e6, 1),
        "route_p99_us": round(times[int(len(times) * 0.99)] * 1e6, 1),
    }


async def poll_health(url: str, warm: asyncio.Event, stop: asyncio.Event) -> list[float]:
    """``/health`` every 5 ms; the latencies from when ``warm`` is set (after 20 polls) to ``stop``."""
    latencies = []
    async with aiohttp.ClientSession() as http:
        polls = 0
        while not stop.is_set():
            started = time.perf_counter()
            async with http.get(f"{url}/health") as response:
                await response.read()
            polls += 1
            if polls == 20:
                warm.set()
            elif polls > 20:
                latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)
    return latencies


async def attacker(kind: str, url: str, count: int) -> None:
    """In a process of its own (what it costs itself is not the server's): subscribe every pattern,
    say so, then take what comes until killed."""
    patterns = adversarial_patterns(count)
    if kind == "mesh":
        client = await MeshClient(url, timeout=60).connect()
        for pattern in patterns:
            client.subscribe(pattern, lambda subject, body: None)
        await client.flush(timeout=60)
    else:
        connection = await nats.connect(url)
        for pattern in patterns:
            await connection.subscribe(pattern, cb=_ignore)
        await connection.flush(timeout=60)
    print("subscribed", flush=True)
    await asyncio.Event().wait()


async def start_attacker(kind: str, url: str, count: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--attacker",
        kind,
        url,
        "--patterns",
        str(count),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if line.strip() != b"subscribed":
        raise RuntimeError(f"the {kind} attacker did not subscribe: {line!r}")
    return proc


async def meshplane_node(patterns: list[str], subjects: list[str]) -> dict[str, Any]:
    with StreamsServerProcess(extra_args=("--node-id", "m", "--route-port", "0")) as node:
        node.start()
        attacker_proc = await start_attacker("mesh", node.route_url, len(patterns))
        honest = await MeshClient(node.route_url).connect()
        received = asyncio.Event()
        count = 0

        def on_event(subject: str, body: bytes) -> None:
            nonlocal count
            count += 1
            if count == len(subjects):
                received.set()

        honest.subscribe("w.>", on_event)
        await honest.flush()
        publisher = await MeshClient(node.route_url).connect()
        stop, warm = asyncio.Event(), asyncio.Event()
        health = asyncio.create_task(poll_health(node.url, warm, stop))
        await warm.wait()
        started = time.perf_counter()
        for subject in subjects:
            await publisher.publish(subject, b"x" * 100)
        await asyncio.wait_for(received.wait(), 120)
        elapsed = time.perf_counter() - started
        stop.set()
        latencies = sorted(await health)
        attacker_proc.kill()
        await attacker_proc.wait()
        for client in (publisher, honest):
            await client.close()
    return {
        "events_per_s": round(len(subjects) / elapsed),
        "health_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "health_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
        "health_polls": len(latencies),
    }


async def nats_server(patterns: list[str], subjects: list[str]) -> dict[str, Any]:
    with NatsServer() as server:
        server.start()
        attacker_proc = await start_attacker("nats", server.url, len(patterns))
        honest = await nats.connect(server.url)
        received = asyncio.Event()
        count = 0

        async def on_message(msg: Any) -> None:
            nonlocal count
            count += 1
            if count == len(subjects):
                received.set()

        await honest.subscribe("w.>", cb=on_message)
        await honest.flush()
        publisher = await nats.connect(server.url)
        started = time.perf_counter()
        for subject in subjects:
            await publisher.publish(subject, b"x" * 100)
        await publisher.flush()
        await asyncio.wait_for(received.wait(), 120)
        elapsed = time.perf_counter() - started
        attacker_proc.kill()
        await attacker_proc.wait()
        for client in (publisher, honest):
            await client.close()
    return {"events_per_s": round(len(subjects) / elapsed)}


async def _ignore(msg: Any) -> None:
    return None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patterns", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--attacker", nargs=2, metavar=("KIND", "URL"), help=argparse.SUPPRESS)
    add_out(parser, "mesh_matching", "--output")
    args = parser.parse_args()
    if args.attacker:
        return await attacker(args.attacker[0], args.attacker[1], args.patterns)
    patterns = adversarial_patterns(args.patterns)
    subjects = new_subjects(args.events)
    core = routing_core(patterns, subjects)
    print(f"routing core: median {core['route_median_us']} us, p99 {core['route_p99_us']} us per new subject")
    mesh = await meshplane_node(patterns, subjects)
    peer = await nats_server(patterns, subjects)
    ratio = round(mesh["events_per_s"] / peer["events_per_s"], 2)
    print(
        f"node: {mesh['events_per_s']} events/s on new subjects, /health p50 {mesh['health_p50_ms']} ms "
        f"p99 {mesh['health_p99_ms']} ms; nats-server {peer['events_per_s']} events/s; ratio {ratio}x"
    )
    result = {
        "patterns": args.patterns,
        "events": args.events,
        "routing_core": core,
        "meshplane": mesh,
        "nats_server": peer,
        "ratio_events_per_s": ratio,
        "goals": {
            "route_median_under_1ms": core["route_median_us"] < 1000,
            "health_p99_under_50ms": mesh["health_p99_ms"] < 50,
        },
    }
    write_results(args.output, result)


if __name__ == "__main__":
    asyncio.run(main())
