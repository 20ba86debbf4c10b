"""What Message VPNs cost the streams side (issue 58): one server, 100-byte events appended over HTTP
in batches of 1000 (fsync every 10 ms), in interleaved rounds (each side first in turn):

- a token of the default VPN, on a server that names no VPN (today's deployments);
- a token of the default VPN, on a server whose tokens name two more VPNs;
- a token of a named VPN on that server (its own service and data directory).

The medians of each side and their ratios to the first. ``python bench/streams_vpns.py`` writes
bench/results/streams_vpns.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import add_out, machine, write_results
from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient

DEFAULT_TOKEN = "bench-default-token-0001"
A_TOKEN = "bench-team-a-token-00002"
B_TOKEN = "bench-team-b-token-00003"
BATCH = 1000


async def append_rate(url: str, token: str, topic: str, events: int) -> float:
    async with StreamsClient(url, token=token) as client:
        if topic not in await client.topics():
            await client.create_topic(topic, 1)
        batch = [{"event_type": "e", "data": "x" * 100} for _ in range(BATCH)]
        start = time.perf_counter()
        for _ in range(events // BATCH):
            await client.publish_batch(topic, batch, partition=0)
        return events / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=50_000, help="events per round and side")
    parser.add_argument("--rounds", type=int, default=5)
    add_out(parser, "streams_vpns")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "vpns.toml").write_text("[vpns.team-a]\n[vpns.team-b]\n")
        (root / "plain").write_text(f"{DEFAULT_TOKEN}\n")
        (root / "vpns").write_text(f"{DEFAULT_TOKEN}\n{A_TOKEN} vpn:team-a\n{B_TOKEN} vpn:team-b\n")
        plain = StreamsServerProcess(extra_args=("--token-file", str(root / "plain")))
        named = StreamsServerProcess(
            extra_args=("--mesh-vpns", str(root / "vpns.toml"), "--token-file", str(root / "vpns"))
        )
        sides: dict[str, list[float]] = {"no VPN": [], "default VPN beside two": [], "named VPN": []}
        with plain, named:
            plain.start()
            named.start()
            runs = {
                "no VPN": (plain.url, DEFAULT_TOKEN),
                "default VPN beside two": (named.url, DEFAULT_TOKEN),
                "named VPN": (named.url, A_TOKEN),
            }
            order = list(runs)
            for round_ in range(args.rounds):
                for side in order[round_ % 3 :] + order[: round_ % 3]:  # each side first in turn
                    url, token = runs[side]
                    sides[side].append(asyncio.run(append_rate(url, token, "bench", args.events)))
    medians = {side: statistics.median(rates) for side, rates in sides.items()}
    results: dict[str, Any] = {
        "machine": machine(),
        "events_per_round": args.events,
        "rounds": args.rounds,
        "append_rate_median": {side: round(rate) for side, rate in medians.items()},
        "ratio_to_no_vpn": {side: round(rate / medians["no VPN"], 3) for side, rate in medians.items()},
    }
    write_results(args.out, results)
    for side, rate in medians.items():
        print(f"{side:26} {rate:12,.0f} events/s  ratio {rate / medians['no VPN']:.3f}")


if __name__ == "__main__":
    main()
