"""A burst of interest changes crosses a gateway (between clusters) in INTEREST frames and converges
exactly; a gateway that does not take them (as gateways before them) still gets one frame per change."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

import pytest

from meshplane.core.mesh.frames import FrameType, InterestChange, encode_frame, encode_payload
from meshplane.launchers import StreamsServerProcess, free_port
from tests.helpers import eventually
from tests.mesh_peers import RawPeer
from tests.support.mesh import burst_crosses, status

BURST = 5_000


def two_clusters(older_b: bool) -> dict[str, StreamsServerProcess]:
    """a (cluster A's gateway) and b (cluster B's), each linked to the other by a gateway only."""
    ports = {name: free_port() for name in ("a", "b")}
    nodes = {}
    for name, other in (("a", "b"), ("b", "a")):
        args = ["--node-id", name, "--cluster", name.upper(), "--route-port", str(ports[name])]
        args += ["--heartbeat-interval", "1.0"]
        args += ["--gateway", f"{other.upper()}=tcp://127.0.0.1:{ports[other]}"]
        if older_b and name == "b":
            args += ["--mesh-fault", "no_interest_batches"]
        nodes[name] = StreamsServerProcess(extra_args=tuple(args))
    return nodes


async def gateway_at(node: StreamsServerProcess, cluster: str) -> dict[str, Any]:
    """The gateway link to ``cluster`` as ``GET /mesh`` shows it (empty before the first connection)."""
    return next((g for g in (await status(node))["gateways"] if g["cluster"] == cluster), {})


@pytest.mark.timeout(170)  # its waits add up to 150 s
@pytest.mark.parametrize("older", [False, True], ids=["batched", "older_peer"])
async def test_a_burst_of_subscriptions_crosses_a_gateway(older: bool) -> None:
    nodes = two_clusters(older_b=older)
    try:
        for node in nodes.values():
            node.start()

        async def up() -> bool:
            states = [(await gateway_at(nodes[n], c)).get("state") for n, c in (("a", "B"), ("b", "A"))]
            return states == ["up", "up"]

        await eventually(up, timeout=30, interval=0.05, what="the gateways up")
        seen = partial(gateway_at, nodes["b"], "A")
        await burst_crosses(nodes["a"].route_url, nodes["b"].route_url, seen, not older, BURST)
    finally:
        for node in nodes.values():
            node.cleanup()


async def test_a_gateway_checks_each_change_of_an_interest_frame() -> None:
    """A peer cluster's gateway that breaks the rules: a frame that is no list of changes is counted and
    dropped, a bad pattern among good ones costs only itself, a version from the future closes the link."""
    args = (
        "--node-id",
        "a",
        "--cluster",
        "A",
        "--route-port",
        "0",
        "--gateway",
        f"B=tcp://127.0.0.1:{free_port()}",
    )
    with StreamsServerProcess(extra_args=args) as node:
        node.start()
        peer = RawPeer(node.route_url, "gB", "B", "gateway", epoch=time.time_ns())
        await asyncio.to_thread(peer.authenticate)

        def interest(*changes: tuple[bool, str, int]) -> bytes:
            payload = encode_payload([InterestChange(*change) for change in changes])
            return encode_frame(FrameType.INTEREST, "gB", payload=payload)

        peer.send(encode_frame(FrameType.INTEREST, "gB", payload=b"\xc1not msgpack"))
        peer.send(interest((True, "ok.1", 1), (True, "bad..x", 2), (True, "ok.2", 3), (False, "ok.1", 4)))

        async def applied() -> bool:
            return bool((await status(node))["patterns"]["gateways"].get("B") == ["ok.2"])

        await eventually(applied, timeout=20, interval=0.05, what="the good changes applied")
        from_b = await gateway_at(node, "B")
        assert from_b["bad_frames"] == 2
        assert (from_b["interest_frames_in"], from_b["sub_add_in"], from_b["sub_remove_in"]) == (2, 2, 1)
        peer.send(interest((True, "ok.3", 5), (True, "late.1", 2**62)))
        assert await asyncio.to_thread(peer.closed)
        assert int((await status(node))["counters"].get("closed_version_jump", 0)) == 1
        assert (await status(node))["patterns"]["gateways"]["B"] == ["ok.2"]  # nothing of the refused frame
