"""Guaranteed events through the mesh, against direct ones in the same run (issue 17's benchmark).

Two nodes (``meshplane serve --node-id``, separate processes, fsync ``interval``), a queue on b, one
publisher on a:

- direct: events from a to a subscriber on b (at most once), until the subscriber has them all;
- guaranteed: the same events published guaranteed in rounds of ``--window`` (each round awaits all
  its ACKs before the next starts) until b's queue has stored them all; the ratio guaranteed/direct is
  printed;
- guaranteed, ``--in-flight`` at once: a sliding window instead (``publish_async``: a publish is sent
  as soon as the oldest in flight is acknowledged), as a client that keeps a number in flight does;
- against raw JetStream R1 (nats-server from the wheel, nats-py ``publish_async`` with the same
  number in flight, until the stream has them all), both at their default durability (meshplane: an
  fsync every 10 ms; JetStream: every 2 minutes), then both fsyncing before every acknowledgement
  (``--fsync always``; ``sync_interval: always``), each pair in the same run;
- recovery: b killed (SIGKILL), ``--spooled`` guaranteed events published (spooled on a), b
  restarted: seconds from the restart until its queue holds them all;
- HA takeover: node a as two mates on one data directory; SIGKILL the active: seconds until the
  standby serves, and until a guaranteed event published on b right after the kill is in a's queue.
- mirrored mates: node a as two mates with their own data directories (``--mates-etcd``, a real
  etcd), a's queue mirrored to the standby before each acknowledgement: guaranteed events from a
  publisher on b until a's queue holds them, against the same with a single node a, in the same run;
  then SIGSTOP of the active: seconds until the standby serves.

    python bench/mesh_guaranteed.py [--events N] [--spooled N]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import nats

from harness import add_out, write_results
from meshplane.cli.bench import Steps
from meshplane.launchers import MeshCluster, NatsServer, StreamsServerProcess, free_port
from meshplane.launchers.etcd import EtcdServer
from meshplane.mesh.client import MeshClient

BODY = b"x" * 100


async def mesh_status(node: StreamsServerProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{node.url}/mesh") as response:
        answer: dict[str, Any] = await response.json()
        return answer


async def stored(node: StreamsServerProcess) -> int:
    try:
        queues = (await mesh_status(node))["guaranteed"]["queues"]
    except aiohttp.ClientError:
        return 0
    return sum(int(q["stored"]) for q in queues)


async def wait_stored(node: StreamsServerProcess, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while await stored(node) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} events not stored within {timeout}s")
        await asyncio.sleep(0.01)


async def wait_link(node: StreamsServerProcess, peer: str, state: str) -> None:
    while True:
        links = (await mesh_status(node))["links"]
        if any(link["peer"] == peer and link["state"] == state for link in links):
            return
        await asyncio.sleep(0.02)


async def publish_guaranteed(client: MeshClient, subject: str, count: int, window: int) -> None:
    """Rounds of ``window`` publishes, each round's answers all awaited before the next is sent."""
    for start in range(0, count, window):
        answers = [await client.publish_async(subject, BODY) for _ in range(min(window, count - start))]
        for answer in answers:
            await answer


async def publish_in_flight(client: MeshClient, subject: str, count: int, in_flight: int) -> None:
    """At most ``in_flight`` unanswered at once, each answer's future awaited oldest first (no task
    per publish: ``publish_async``)."""
    pending: collections.deque[asyncio.Future[None]] = collections.deque()
    for _ in range(count):
        if len(pending) >= in_flight:
            await pending.popleft()
        pending.append(await client.publish_async(subject, BODY))
    for answer in pending:
        await answer


async def direct_run(cluster: MeshCluster, events: int) -> float:
    received = 0
    done = asyncio.Event()

    def count(subject: str, body: bytes) -> None:
        nonlocal received
        received += 1
        if received >= events:
            done.set()

    subscriber = await MeshClient(cluster["b"].route_url).connect()
    publisher = await MeshClient(cluster["a"].route_url).connect()
    subscriber.subscribe("bench.direct", count)
    await subscriber.flush(propagated=True)
    started = time.perf_counter()
    for _ in range(events):
        await publisher.publish("bench.direct", BODY)
    await asyncio.wait_for(done.wait(), 120)
    seconds = time.perf_counter() - started
    await publisher.close()
    await subscriber.close()
    return events / seconds


async def raw_jetstream(url: str, count: int, in_flight: int) -> float:
    """Events/s of nats-py publishing into a JetStream R1 stream, ``in_flight`` unanswered at once."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=120, publish_async_max_pending=in_flight)
        await js.add_stream(name="BENCH", subjects=["bench.js"], num_replicas=1)
        pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        started = time.perf_counter()
        for _ in range(count):
            if len(pending) >= in_flight:
                await pending.popleft()
            pending.append(await js.publish_async("bench.js", BODY))
        for answer in pending:
            await answer
        seconds = time.perf_counter() - started
        stored = (await js.stream_info("BENCH")).state.messages
        if stored != count:
            raise RuntimeError(f"JetStream holds {stored} of {count} events")
        await js.delete_stream("BENCH")
    finally:
        await nc.close()
    return count / seconds


async def against_jetstream(events: int, in_flight: int) -> dict[str, dict[str, float]]:
    """Guaranteed events a -> b's queue and raw JetStream R1, ``in_flight`` at once, at both
    durabilities."""
    results = {}
    for name, fsync, sync_interval in (("default", "interval", None), ("fsync_always", "always", "always")):
        with MeshCluster(2, heartbeat_interval=0.5, extra_args=("--fsync", fsync)) as cluster:
            cluster.start()
            await asyncio.to_thread(cluster.wait_linked)
            await put_queue(cluster["b"], "bench", "bench.guaranteed", known_at=cluster["a"])
            publisher = await MeshClient(cluster["a"].route_url, timeout=120).connect()
            started = time.perf_counter()
            await publish_in_flight(publisher, "bench.guaranteed", events, in_flight)
            await wait_stored(cluster["b"], events)
            mesh = events / (time.perf_counter() - started)
            await publisher.close()
        with NatsServer(jetstream=True, sync_interval=sync_interval) as server:
            server.start()
            raw = await raw_jetstream(server.url, events, in_flight)
        results[name] = {
            "meshplane_events_per_s": round(mesh),
            "raw_jetstream_r1_events_per_s": round(raw),
            "ratio": round(mesh / raw, 2),
        }
        print(
            f"against JetStream R1 ({name}): meshplane {mesh:,.0f} events/s, raw nats-py {raw:,.0f} "
            f"({mesh / raw:.2f}x), {in_flight:,} in flight"
        )
    return results


async def main_async(args: argparse.Namespace, steps: Steps) -> dict[str, Any]:
    with MeshCluster(2, heartbeat_interval=0.5) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        await put_queue(cluster["b"], "bench", "bench.guaranteed", known_at=cluster["a"])

        direct = await direct_run(cluster, args.events)
        print(f"direct      a->b: {direct:>9,.0f} events/s (subscriber on b has them all)")
        steps.step("direct events")

        publisher = await MeshClient(cluster["a"].route_url, timeout=120).connect()
        started = time.perf_counter()
        await publish_guaranteed(publisher, "bench.guaranteed", args.events, args.window)
        acked = time.perf_counter() - started
        await wait_stored(cluster["b"], args.events)
        guaranteed = args.events / (time.perf_counter() - started)
        print(
            f"guaranteed  a->b: {guaranteed:>9,.0f} events/s (stored in b's queue; "
            f"all acknowledged after {acked:.2f} s)"
        )
        steps.step("guaranteed events")

        started = time.perf_counter()
        await publish_in_flight(publisher, "bench.guaranteed", args.events, args.in_flight)
        await wait_stored(cluster["b"], 2 * args.events)
        sliding = args.events / (time.perf_counter() - started)
        print(f"guaranteed  a->b: {sliding:>9,.0f} events/s with {args.in_flight:,} in flight (sliding)")
        steps.step("guaranteed events, a sliding window")

        cluster["b"].kill(signal.SIGKILL)
        await wait_link(cluster["a"], "b", "down")
        started = time.perf_counter()
        await publish_guaranteed(publisher, "bench.guaranteed", args.spooled, args.window)
        spool_rate = args.spooled / (time.perf_counter() - started)
        await publisher.close()
        restarted = time.perf_counter()
        cluster["b"].start()
        up = time.perf_counter() - restarted
        await wait_stored(cluster["b"], args.spooled)
        recovery = time.perf_counter() - restarted
        print(
            f"recovery: {args.spooled:,} events spooled on a while b was down ({spool_rate:,.0f}/s); "
            f"b restarted in {up:.2f} s and held them all {recovery:.2f} s after its restart"
        )
        steps.step("recovery of a spool")
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "body_bytes": len(BODY),
        "fsync": "interval (10 ms, the default)",
        "events": args.events,
        "window": args.window,
        "direct_events_per_s": round(direct),
        "guaranteed_events_per_s": round(guaranteed),
        "ratio_guaranteed_to_direct": round(guaranteed / direct, 2),
        "in_flight": args.in_flight,
        "guaranteed_sliding_window_events_per_s": round(sliding),
        "ratio_sliding_window_to_direct": round(sliding / direct, 2),
        "recovery": {
            "spooled_events": args.spooled,
            "spooling_events_per_s": round(spool_rate),
            "process_start_s": round(up, 2),
            "all_stored_after_restart_s": round(recovery, 2),
        },
    }


async def ha_takeover(tmp: Path) -> dict[str, float]:
    a1_port, a2_port, b_port = free_port(), free_port(), free_port()
    common = ("--node-id", "a", "--routes", f"tcp://127.0.0.1:{b_port}", "--heartbeat-interval", "0.5")
    a1 = StreamsServerProcess(data_dir=tmp / "a", extra_args=(*common, "--route-port", str(a1_port)))
    a2 = StreamsServerProcess(
        data_dir=tmp / "a", extra_args=(*common, "--route-port", str(a2_port), "--standby")
    )
    b_routes = f"tcp://127.0.0.1:{a1_port},tcp://127.0.0.1:{a2_port}"
    b = StreamsServerProcess(
        extra_args=(
            "--node-id",
            "b",
            "--route-port",
            str(b_port),
            "--routes",
            b_routes,
            "--heartbeat-interval",
            "0.5",
        )
    )
    with a1, a2, b:
        a1.start()
        a2.start(ready=False)
        b.start()
        await put_queue(a1, "ha", "ha.>", known_at=b)
        publisher = await MeshClient(b.route_url).connect()
        await publisher.publish("ha.x", BODY, guaranteed=True)
        killed = time.perf_counter()
        a1.kill(signal.SIGKILL)
        await publisher.publish("ha.x", BODY, guaranteed=True)  # spooled on b until a is back
        await asyncio.to_thread(a2.wait_ready, 30)
        serving = time.perf_counter() - killed
        await wait_stored(a2, 1)  # counted since the takeover: the event published after the kill
        stored_after = time.perf_counter() - killed
        await publisher.close()
    return {"standby_serving_s": round(serving, 3), "event_after_kill_stored_s": round(stored_after, 3)}


async def put_queue(
    node: StreamsServerProcess, name: str, pattern: str, known_at: StreamsServerProcess
) -> None:
    """A queue on ``node``, once the node ``known_at`` knows of it."""
    url = f"{node.url}/mesh/queues/{name}"
    async with aiohttp.ClientSession() as http, http.put(url, json={"patterns": [pattern]}) as response:
        response.raise_for_status()
    while True:
        if f"$G.{pattern}" in json.dumps(await patterns(known_at)):
            return
        await asyncio.sleep(0.02)


async def patterns(node: StreamsServerProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{node.url}/mesh?patterns=1") as response:
        answer: dict[str, Any] = (await response.json())["patterns"]
        return answer


async def mirrored(tmp: Path, events: int, window: int) -> dict[str, float]:
    """Guaranteed events b -> a's queue, a single node then a pair of mirrored mates; the takeover."""
    rates, takeover = [], 0.0
    with EtcdServer() as etcd, contextlib.ExitStack() as stack:
        etcd.start()
        for mates in (1, 2):
            b_port, ports = free_port(), [free_port() for _ in range(mates)]
            cluster = ("--cluster", f"bench{mates}", "--heartbeat-interval", "0.5")
            a_args: tuple[str, ...] = (*cluster, "--node-id", "a", "--routes", f"tcp://127.0.0.1:{b_port}")
            if mates == 2:
                a_args += ("--mates-etcd", etcd.endpoint)
            a = [
                stack.enter_context(
                    StreamsServerProcess(
                        port=free_port(),
                        data_dir=tmp / f"{mates}-a{i}",
                        extra_args=(*a_args, "--route-port", str(port)),
                    )
                )
                for i, port in enumerate(ports)
            ]
            routes = ",".join(f"tcp://127.0.0.1:{port}" for port in ports)
            b_args = (*cluster, "--node-id", "b", "--route-port", str(b_port), "--routes", routes)
            b = stack.enter_context(StreamsServerProcess(extra_args=b_args))
            a[0].start()
            for standby in a[1:]:
                standby.start(ready=False)
            b.start()
            await put_queue(a[0], "m", "m.x", known_at=b)
            if mates == 2:
                await wait_in_sync(a[0])
            publisher = await MeshClient(b.route_url, timeout=120).connect()
            started = time.perf_counter()
            await publish_guaranteed(publisher, "m.x", events, window)
            await wait_stored(a[0], events)
            rates.append(events / (time.perf_counter() - started))
            await publisher.close()
            if mates == 2:
                paused = time.perf_counter()
                a[0].kill(signal.SIGSTOP)
                await asyncio.to_thread(a[1].wait_ready, 30)
                takeover = time.perf_counter() - paused
                a[0].kill(signal.SIGCONT)
    return {
        "single_node_events_per_s": round(rates[0]),
        "mirrored_mates_events_per_s": round(rates[1]),
        "ratio_mirrored_to_single": round(rates[1] / rates[0], 2),
        "paused_active_replaced_s": round(takeover, 2),
    }


async def wait_in_sync(active: StreamsServerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (await mesh_status(active))["mate"]["state"] != "in_sync":
        if time.monotonic() > deadline:
            raise TimeoutError("the standby did not catch up")
        await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--spooled", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=2_000, help="guaranteed publishes per round")
    parser.add_argument("--in-flight", type=int, default=1_000, help="the sliding window's publishes")
    parser.add_argument("--mirrored", type=int, default=50_000, help="events for the mirrored mates part")
    add_out(parser, "mesh_guaranteed")
    args = parser.parse_args()
    steps = Steps(7)
    results = asyncio.run(main_async(args, steps))
    results["against_jetstream"] = asyncio.run(against_jetstream(args.events, args.in_flight))
    steps.step("against raw JetStream R1")
    with tempfile.TemporaryDirectory() as tmp:
        results["ha_takeover"] = asyncio.run(ha_takeover(Path(tmp)))
    steps.step("HA takeover")
    ha = results["ha_takeover"]
    print(
        f"HA takeover: the standby served {ha['standby_serving_s']} s after SIGKILL of the active; an event "
        f"published right after the kill was in a's queue after {ha['event_after_kill_stored_s']} s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        results["mirrored_mates"] = asyncio.run(mirrored(Path(tmp), args.mirrored, args.window))
    steps.step("mirrored mates")
    m = results["mirrored_mates"]
    print(
        f"mirrored mates: b -> a's queue {m['mirrored_mates_events_per_s']:,} events/s against "
        f"{m['single_node_events_per_s']:,} with a single node a ({m['ratio_mirrored_to_single']}x); "
        f"a paused active replaced after {m['paused_active_replaced_s']} s"
    )
    print(f"guaranteed/direct throughput: {results['ratio_guaranteed_to_direct']}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
