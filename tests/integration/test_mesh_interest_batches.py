"""A burst of interest changes crosses a route in INTEREST frames (many changes each) and converges
exactly; a node that does not take them (as nodes before them) still gets one frame per change."""

from __future__ import annotations

import asyncio
import random
from functools import partial

import pytest

from meshplane.core.mesh.frames import Frame, FrameType, encode_event, encode_frame, event_parts
from meshplane.core.subjects import matches
from meshplane.launchers import MeshCluster
from tests.helpers import eventually
from tests.mesh_peers import RawPeer
from tests.support.mesh import burst_crosses, link, status

BURST = 5_000


@pytest.mark.timeout(160)  # its waits add up to 140 s
@pytest.mark.parametrize("older", [False, True], ids=["batched", "older_peer"])
async def test_a_burst_of_subscriptions_is_fully_propagated(older: bool) -> None:
    older_b: dict[str, tuple[str, ...]] = {"b": ("--mesh-fault", "no_interest_batches")}
    node_args = older_b if older else None
    with MeshCluster(2, heartbeat_interval=1.0, node_args=node_args) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        await burst_crosses(
            cluster["a"].route_url, cluster["b"].route_url, partial(link, cluster["b"], "a"), not older, BURST
        )


async def test_a_clients_burst_of_sub_frames_keeps_its_order_with_its_events() -> None:
    """A client's burst of SUB_ADD / SUB_REMOVE frames, many to a read, among its events: each event
    comes back to it exactly when a pattern it held at that point matches; the node's patterns, and its
    peer's copy (in INTEREST frames), are what the frames one by one leave."""
    rng = random.Random(60)
    patterns = [f"mix.{i}" for i in range(40)] + ["mix.*", "mix.>"]
    held: set[str] = set()
    frames: list[bytes] = []
    expected: list[int] = []  # the numbers of the events it gets back (their bodies), in order
    for sequence in range(1, 4001):
        pattern = rng.choice(patterns)
        if rng.random() < 0.55:
            held.add(pattern)
            frames.append(encode_frame(FrameType.SUB_ADD, "", pattern))
        else:
            held.discard(pattern)
            frames.append(encode_frame(FrameType.SUB_REMOVE, "", pattern))
        if rng.random() < 0.3:
            subject = f"mix.{rng.randrange(40)}"
            frames.append(encode_event("", subject, sequence, 0, b"%d" % sequence))
            if any(matches(p, subject) for p in held):
                expected.append(sequence)
    with MeshCluster(2, heartbeat_interval=1.0) as cluster:
        cluster.start()
        await asyncio.to_thread(cluster.wait_linked)
        peer = await asyncio.to_thread(RawPeer(cluster["a"].route_url, "burst", "", "client").authenticate)
        try:
            peer.send(*frames, encode_frame(FrameType.SYNC_REQ, "", sequence=1))
            answered = await asyncio.to_thread(frames_until, peer, FrameType.SYNC_RESP)
            assert [int(event_parts(f)[1]) for f in answered if f.type is FrameType.EVENT] == expected
            assert sorted((await status(cluster["a"]))["patterns"]["local"]) == sorted(held)

            async def copied() -> bool:
                return bool((await status(cluster["b"]))["patterns"]["peers"].get("a") == sorted(held))

            await eventually(copied, timeout=30, interval=0.05, what="b's copy of a's patterns")
        finally:
            peer.close()


def frames_until(peer: RawPeer, kind: FrameType) -> list[Frame]:
    """Every frame the node sent up to the first of ``kind``."""
    while not any(frame.type is kind for frame in peer.frames):
        data = peer.sock.recv(65536)
        if not data:
            raise ConnectionError(f"the node closed the connection before a {kind.name}")
        peer.receive(data)
    return peer.frames
