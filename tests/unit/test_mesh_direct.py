"""The node's direct path: ``route_events`` in C (``_frames.c``) against the Python reference
(``core/mesh/direct.py``) on any stream, route table, write-buffer limit and dedup state: the same
offset, runs, buffers (a frame as it came, or a NATS client's MSG) and dedup ids, in the same order."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.mesh import direct
from meshplane.core.mesh._frames import DedupIds
from meshplane.core.mesh.dedup import EventId, Ids, PyIds
from meshplane.core.mesh.frames import FrameType, SyncResponse, encode_event, encode_frame, encode_payload
from meshplane.core.mesh.vpn import DEFAULT, prefix_of
from meshplane.core.subjects import MAX_SUBJECT_BYTES
from meshplane.launchers import free_port
from meshplane.mesh.client import MeshClient
from meshplane.mesh.config import MeshConfig
from meshplane.mesh.node import MeshNode
from meshplane.mesh.vpns import parse_vpns
from tests.helpers import eventually
from tests.mesh_peers import answer_dial
from tests.unit.test_mesh_frames_native import damaged

MAX_PAYLOAD = 400
SOURCES = ["a", "node-b", "n" * 16, "é"]
SUBJECTS = ["x.y", "orders.eu", "ünï.cødé", "z" * 40, "$vpn:A.orders.eu"]


def test_the_extension_has_the_direct_path() -> None:
    assert direct.native_route_events is not None, "the C extension was not built"


PLAIN = st.builds(  # from a small pool, so that the same event comes again (a duplicate)
    lambda source, subject, sequence, stamp, body, flags: encode_event(
        source, subject, sequence, stamp, body, flags
    ),
    st.sampled_from(SOURCES[:1] * 6 + SOURCES[1:]),
    st.sampled_from(SUBJECTS[:2] * 3 + SUBJECTS[2:]),
    st.integers(0, 3),
    st.sampled_from([0, 1, 1, 2**64 - 1]),
    st.sampled_from([b"", b"body", b"x" * 60]),
    st.sampled_from([0] * 12 + [1, 4]),
)
OTHER = st.builds(  # damaged or of another kind: both stop there
    lambda kind, source, subject, how, where: damaged(
        encode_frame(kind, source, subject, 7, b"12345678"), how, where
    ),
    st.sampled_from([FrameType.EVENT, FrameType.HEARTBEAT, FrameType.SUB_ADD]),
    st.sampled_from(SOURCES),
    st.sampled_from(SUBJECTS),
    st.sampled_from(["none", "flip", "type", "text", "subject", "payload_length", "short_event"]),
    st.integers(0, 1000),
)
FRAME = st.one_of(PLAIN, PLAIN, PLAIN, PLAIN, PLAIN, PLAIN, OTHER)


Table = Callable[[Callable[[int], Ids]], tuple[dict[bytes, direct.Entry], list[bytearray]]]


@st.composite
def tables(draw: st.DrawFn) -> Table:
    """A table maker: the same routes, buffers and dedup ids, each time with ids of the kind asked."""
    buffers = [draw(st.binary(max_size=30)) for _ in range(3)]
    routes: list[tuple[str, list[EventId] | None, int, list[tuple[int, bool]]]] = []
    for subject in draw(st.lists(st.sampled_from(SUBJECTS), unique=True, min_size=3)):
        keys: list[EventId] | None = None
        if draw(st.booleans()):
            keys = [
                (stamp, sequence, source, "p")
                for stamp, sequence, source in draw(
                    st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(0, 3), st.sampled_from(SOURCES)))
                )
            ]
        chosen = draw(st.lists(st.integers(0, 2), unique=True, min_size=1))
        messages = draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
        routes.append((subject, keys, draw(st.integers(1, 4)), list(zip(chosen, messages, strict=True))))

    def make(kind: Callable[[int], Ids]) -> tuple[dict[bytes, direct.Entry], list[bytearray]]:
        made = [bytearray(b) for b in buffers]
        table: dict[bytes, direct.Entry] = {}
        for subject, keys, bound, chosen in routes:
            ids = None
            if keys is not None:
                ids = kind(bound)
                for key in keys:
                    ids.seen(key, 1.0)
            targets: tuple[direct.Target, ...] = tuple(  # a NATS client's MSGs, or the frames
                (made[i], f"MSG {subject} {i} ".encode()) if message else made[i] for i, message in chosen
            )
            table[subject.encode()] = (subject, ids, targets)
        return table, made

    return make


@settings(max_examples=600)
@given(
    st.one_of(st.lists(PLAIN, min_size=1, max_size=16), st.lists(FRAME, min_size=1, max_size=16)),
    st.one_of(st.just(0), st.integers(0, 40)),
    tables(),
    st.sampled_from([None, None, None, "a", "node-b"]),
    st.sampled_from([SOURCES, SOURCES, SOURCES, SOURCES[:2], SOURCES[1:], []]),
    st.sampled_from([60, 300, 1 << 20, 1 << 20]),
)
def test_c_and_python_route_the_same(
    frames: list[bytes],
    cut: int,
    make_table: Table,
    origin: str | None,
    known: list[str],
    limit: int,
) -> None:
    assert direct.native_route_events is not None
    stream = b"".join(frames)
    stream = stream[: len(stream) - cut] if cut < len(stream) else stream
    raw_origin = origin.encode().ljust(16, b"\x00") if origin is not None else None
    text = {source.encode().ljust(16, b"\x00"): source for source in known}
    outcomes: list[Any] = []
    for route, kind in ((direct.route_events, PyIds), (direct.native_route_events, DedupIds)):
        table, buffers = make_table(kind)
        runs: list[tuple[Any, int, int]] = []
        end = route(
            stream,
            0,
            MAX_PAYLOAD,
            MAX_SUBJECT_BYTES,
            raw_origin,
            text,
            table,
            limit,
            "p",
            2.0,
            runs,
        )
        ids = {key: entry[1].items() for key, entry in table.items() if entry[1] is not None}
        outcomes.append((end, runs, [bytes(b) for b in buffers], ids))
    assert outcomes[0] == outcomes[1]


# --- a node with and without its direct path: the same deliveries and counters ----------------------


def in_vpn(vpn: str) -> dict[str, Any]:
    """A node's configuration with VPN ``vpn`` (and the default)."""
    return {"vpns": parse_vpns(f"[vpns.{vpn}]\n")} if vpn != DEFAULT else {}


def has(got: list[Any], count: int) -> bool:
    return len(got) == count


async def run_node(listener: socket.socket, direct_path: bool, vpn: str = DEFAULT) -> dict[str, Any]:
    """Node "b" dialling raw peer "a" (which wants ``direct.>``), a subscriber and a publisher on b,
    all in ``vpn``: a's events (repeated, duplicated, on subjects b wants and does not) and the
    publisher's, twice over, so that the second time the direct path knows the routes. What came
    out, the counts, and how many of the publisher's events the direct path took."""
    port = listener.getsockname()[1]
    prefix = prefix_of(vpn)
    config = MeshConfig(node_id="b", cluster="c1", routes=(f"tcp://127.0.0.1:{port}",), **in_vpn(vpn))
    node = MeshNode(config)
    node.direct.enabled = direct_path
    await node.start()
    got: list[tuple[str, bytes]] = []
    subscriber = publisher = None
    peer = await asyncio.to_thread(answer_dial, listener, "a")
    try:
        await asyncio.to_thread(peer.read_until, FrameType.SYNC_REQ)
        peer.send(encode_frame(FrameType.SYNC_RESP, "a", payload=encode_payload(SyncResponse(0, {}))))
        peer.send(encode_frame(FrameType.SUB_ADD, "a", prefix + "direct.>", 1))
        await eventually(
            lambda: node.links["a"].state == "up" and bool(node.router.route(prefix + "direct.x").peers)
        )
        subscriber = await MeshClient(node.route_url, vpn=vpn).connect()
        subscriber.subscribe("direct.*", lambda subject, body: got.append((subject, body)))
        await subscriber.flush()
        publisher = await MeshClient(node.route_url, vpn=vpn).connect()
        from_publisher = 0
        for round_ in range(2):
            plain = [
                encode_event("a", prefix + subject, 2 * n + i, 1000, b"a%d" % n)
                for n in range(100 * round_, 100 * round_ + 40)
                for i, subject in enumerate(("direct.x", "direct.y"))
            ]
            peer.send(*plain, *plain[:30])  # the first 30 again: duplicates
            peer.send(  # then what only the Python path takes: no interest here, another flag
                *[encode_event("a", prefix + "elsewhere.z", n, 1000, b"z") for n in range(20)],
                *[
                    encode_event("a", prefix + "direct.x", 10_000 + 100 * round_ + n, 1000, b"a-json", 1)
                    for n in range(20)
                ],
            )
            await eventually(partial(has, got, round_ * 150 + 100), what="a's events")
            taken = node.direct.events
            for n in range(50):
                await publisher.publish("direct.y" if n % 3 else "direct.x", b"p%d" % n)
            await publisher.flush()
            await subscriber.flush()
            await eventually(partial(has, got, round_ * 150 + 150), what="the publisher's events")
            from_publisher += node.direct.events - taken
        forwarded = [
            (frame.subject, frame.payload[8:])
            for frame in [await asyncio.to_thread(peer.read_until, FrameType.EVENT) for _ in range(100)]
        ]
        link = node.links["a"]
        return {  # each origin's order (how the two connections' events interleave is up to timing)
            "got": sorted(got, key=lambda event: event[1][:1]),
            "forwarded": forwarded,
            "direct": node.status()["counters"]["direct_path_events"] > 0,
            "from_publisher": from_publisher,
            "counts": (node.routed, node.deliveries, node.forwarded, link.events_in, link.events_out),
            "vpns": node.status()["vpns"],
            "delivered": sorted((c["vpn"], c["delivered"]) for c in node.status()["clients"]),
            "duplicates": (
                link.counters["duplicates_in"],
                node.dedup.duplicates,
                link.counters["unwanted_in"],
            ),
        }
    finally:
        for client in (subscriber, publisher):
            if client is not None:
                await client.close()
        peer.close()
        await node.close()


@pytest.mark.parametrize("vpn", [DEFAULT, "A"])
async def test_a_node_routes_the_same_with_and_without_its_direct_path(vpn: str) -> None:
    """A named VPN's events (``$vpn:A.`` subjects) take the direct path as the default VPN's do."""
    assert direct.native_route_events is not None
    outcomes = []
    for direct_path in (False, True):
        with socket.create_server(("127.0.0.1", 0)) as listener:
            listener.settimeout(10)
            outcomes.append(await run_node(listener, direct_path, vpn))
    python, compiled = outcomes
    assert not python["direct"]
    assert python["from_publisher"] == 0
    assert compiled["direct"]  # the second run took the direct path
    assert compiled["from_publisher"] > 0  # the publisher's events too, once their route was learnt
    for key in ("got", "forwarded", "counts", "duplicates", "vpns", "delivered"):
        assert python[key] == compiled[key], key
    assert python["duplicates"] == (2 * 30, 2 * 30, 2 * 20)


def collect(into: list[tuple[str, bytes]], subject: str, body: bytes) -> None:
    into.append((subject, body))


async def run_gateways(direct_path: bool, vpn: str = DEFAULT) -> dict[str, Any]:
    """Clusters A and B (a node each) joined by gateways; a publisher on a, a subscriber on a and one
    on b, all in ``vpn``. What each subscriber got, the counts, and whether each node took the direct
    path."""
    ports = free_port(), free_port()
    nodes = [
        MeshNode(
            MeshConfig(
                node_id=name,
                cluster=name.upper(),
                route_port=ports[i],
                gateways=((other.upper(), f"tcp://127.0.0.1:{ports[1 - i]}"),),
                **in_vpn(vpn),
            )
        )
        for i, (name, other) in enumerate((("a", "b"), ("b", "a")))
    ]
    clients: list[MeshClient] = []
    got: dict[str, list[tuple[str, bytes]]] = {"a": [], "b": []}
    try:
        for node in nodes:
            node.direct.enabled = direct_path
            await node.start()
        a, b = nodes
        for node, pattern in ((a, "gw.x"), (b, "gw.*")):
            client = await MeshClient(node.route_url, vpn=vpn).connect()
            client.subscribe(pattern, partial(collect, got[node.node_id]))
            await client.flush()
            clients.append(client)
        await eventually(lambda: any(a.router.route(prefix_of(vpn) + "gw.y").local), what="b's interest at a")
        publisher = await MeshClient(a.route_url, vpn=vpn).connect()
        clients.append(publisher)
        for round_ in range(2):
            for n in range(60):
                await publisher.publish("gw.y" if n % 3 else "gw.x", b"%d-%d" % (round_, n))
            await publisher.flush()
        await eventually(lambda: len(got["b"]) == 120 and len(got["a"]) == 40, what=f"{got}")
        gateway_links = a.gateways.links["B"], b.gateways.links["A"]
        return {
            "got": got,
            "direct": [node.direct.events > 0 for node in nodes],
            "counts": [(node.routed, node.deliveries, node.forwarded) for node in nodes],
            "links": [(link.events_in, link.events_out, dict(link.counters)) for link in gateway_links],
            "vpns": [node.status()["vpns"] for node in nodes],
        }
    finally:
        for client in clients:
            await client.close()
        for node in nodes:
            await node.close()


@pytest.mark.parametrize("vpn", [DEFAULT, "A"])
async def test_gateways_route_the_same_with_and_without_the_direct_path(vpn: str) -> None:
    python, compiled = [await run_gateways(direct_path, vpn) for direct_path in (False, True)]
    assert python["direct"] == [False, False]
    assert compiled["direct"] == [True, True]
    for key in ("got", "counts", "links", "vpns"):
        assert python[key] == compiled[key], key


async def test_a_vpn_a_reload_removes_leaves_no_route_table_and_the_others_keep_the_direct_path(
    tmp_path: Path,
) -> None:
    """Clients of VPNs A and B on the direct path; a reload removes B: B's client is closed and its
    VPN's table of routes goes with it (a node reloaded with ever new VPNs holds none of the old
    ones'), while A's client's events still take the direct path."""
    vpns = tmp_path / "vpns.toml"
    vpns.write_text("[vpns.A]\n[vpns.B]\n")
    node = MeshNode(MeshConfig(node_id="n", vpns=parse_vpns(vpns.read_text()), vpns_file=vpns))
    await node.start()
    clients: dict[str, MeshClient] = {}
    got: dict[str, list[tuple[str, bytes]]] = {"A": [], "B": []}
    try:
        for vpn in ("A", "B"):
            clients[vpn] = await MeshClient(node.route_url, vpn=vpn).connect()
            clients[vpn].subscribe("r.*", partial(collect, got[vpn]))
            await clients[vpn].flush()
        for client in clients.values():
            for n in range(20):
                await client.publish("r.x", b"%d" % n)
                await client.flush()
        await eventually(lambda: len(got["A"]) == len(got["B"]) == 20, what=f"{got}")
        assert set(node.direct._sent) == {"A", "B"}
        vpns.write_text("[vpns.A]\n[vpns.C]\n")
        assert node.logins.reloads.reload()["closed"] == 1
        await eventually(lambda: not clients["B"].connected, what="B's client closed")
        taken = node.direct.events
        for round_ in range(2):  # the first learns the route again, the second takes it
            await clients["A"].publish("r.x", b"after-%d" % round_)
            await clients["A"].flush()
        await eventually(lambda: len(got["A"]) == 22, what=f"{got['A']}")
        assert node.direct.events > taken
        assert set(node.direct._sent) == {"A"}
    finally:
        for client in clients.values():
            await client.close()
        await node.close()
