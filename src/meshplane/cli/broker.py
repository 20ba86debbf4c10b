"""``meshplane broker`` and ``meshplane broker-stats``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys

from meshplane.broker import Broker, query_stats
from meshplane.cli.heap import settle_heap
from meshplane.cli.options import add_plane_options, config_from_args
from meshplane.core.brokers import BROKERS_BUCKET, broker_record
from meshplane.core.records import new_instance_id
from meshplane.discovery import create_discovery
from meshplane.errors import MeshplaneError
from meshplane.transports.curve import Curve


def add_broker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--xsub",
        default="tcp://127.0.0.1:5555",
        metavar="ADDR",
        help="where publishers connect (default tcp://127.0.0.1:5555; port 0 picks a free one)",
    )
    parser.add_argument(
        "--xpub",
        default="tcp://127.0.0.1:5556",
        metavar="ADDR",
        help="where subscribers connect (default tcp://127.0.0.1:5556; port 0 picks a free one)",
    )
    parser.add_argument(
        "--stats",
        default="tcp://127.0.0.1:0",
        metavar="ADDR",
        help="where `meshplane broker-stats` asks for counters (default: a free loopback port)",
    )
    parser.add_argument(
        "--hwm",
        type=int,
        default=100_000,
        metavar="N",
        help="high-water mark of both sides, in messages (default 100000)",
    )
    parser.add_argument(
        "--drop-after",
        type=float,
        default=0.1,
        metavar="S",
        help="how long to wait for a full subscriber queue before dropping (counted) (default 0.1)",
    )
    parser.add_argument(
        "--relay",
        choices=["python", "c"],
        default="c",
        help="c: libzmq's proxy moves the events (default; counts frames and bytes, not messages); "
        "python: every message through Python, counted exactly (slower)",
    )
    parser.add_argument(
        "--no-register",
        action="store_true",
        help="do not register in discovery (registered brokers are found by DYN_ZMQ_BROKER_ENABLED=true "
        "clients)",
    )
    add_plane_options(parser)


def add_stats_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("endpoint", metavar="ADDR", help="the broker's stats address, as it printed at start")
    parser.add_argument(
        "--timeout", type=float, default=5.0, metavar="S", help="how long to wait for an answer"
    )


async def run_broker(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    curve = None
    if config.zmq_curve_cert is not None:  # MESHPLANE_ZMQ_CURVE_CERT and _ALLOWED, as for clients
        curve = Curve.load(config.zmq_curve_cert, config.zmq_curve_allowed)
    broker = Broker(args.xsub, args.xpub, args.stats, args.hwm, args.drop_after, args.relay, curve)
    # Before the ready line: a SIGTERM right after it stops us cleanly (unregistered), where the
    # default action would kill us and leave our record in discovery until its lease ran out
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    address = broker.start()
    discovery = None
    broker_id = new_instance_id()
    key = f"{BROKERS_BUCKET}/{broker_id:x}"
    try:
        if not args.no_register:
            discovery = create_discovery(config)
            await discovery.start()
            await discovery.register(key, broker_record(broker_id, address, broker.stats_endpoint))
        print(
            json.dumps(
                {
                    "xsub": address.xsub,
                    "xpub": address.xpub,
                    "stats": broker.stats_endpoint,
                    "registered": key if discovery else None,
                }
            ),
            flush=True,
        )
        print(
            f"broker ready; clients use DYN_ZMQ_BROKER_URL='xsub={address.xsub} , xpub={address.xpub}'"
            + (" or DYN_ZMQ_BROKER_ENABLED=true" if discovery else ""),
            file=sys.stderr,
            flush=True,
        )
        settle_heap()
        await stop.wait()
    finally:
        if discovery is not None:
            with contextlib.suppress(MeshplaneError):
                await discovery.close()
        broker.stop()
        print(f"broker stopped: {json.dumps(broker.stats())}", file=sys.stderr, flush=True)
    return 0


async def run_broker_stats(args: argparse.Namespace) -> int:
    stats = await asyncio.to_thread(query_stats, args.endpoint, args.timeout)
    print(json.dumps(stats, indent=2))
    return 0
