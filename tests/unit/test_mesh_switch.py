"""A link's switch of connections in process, with raw peers playing the other node: the retired
connection's events come first however long it takes (the new one waits, bounded), and guaranteed
events are never confirmed past a gap in the spool's offsets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from meshplane.core.mesh.frames import FLAG_GUARANTEED, FrameType, encode_event, encode_frame
from meshplane.mesh import routes as routes_module
from meshplane.mesh.config import MeshConfig
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.node import MeshNode
from tests.helpers import eventually
from tests.mesh_peers import RawPeer, answer_dial

HELD = 50


@dataclass(eq=False)
class Sequences:
    numbers: list[int] = field(default_factory=list)

    def deliver(self, event: MeshEvent) -> None:
        self.numbers.append(event.sequence)


@pytest.fixture
async def listener() -> AsyncIterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.settimeout(10)  # a node that never dials fails the test, not hangs it
        yield sock


@pytest.fixture
async def node(listener: socket.socket) -> AsyncIterator[MeshNode]:
    """Node "b", dialling "a" (the raw peer behind ``listener``) as it starts."""
    port = listener.getsockname()[1]
    mesh = MeshNode(MeshConfig(node_id="b", cluster="c1", routes=(f"tcp://127.0.0.1:{port}",)))
    await mesh.start()
    yield mesh
    await mesh.close()


def events(first: int, count: int) -> bytes:
    return b"".join(encode_event("a", "switch.x", n, 1000, b"%d" % n) for n in range(first, first + count))


async def test_the_retired_connections_events_come_first_however_many_the_new_one_brings(
    node: MeshNode, listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routes_module, "HELD_EVENTS", HELD)
    inbox = Sequences()
    node.subscribe(inbox, "switch.>")
    dialled = await asyncio.to_thread(answer_dial, listener, "a")  # b dialled a: the link's first
    await eventually(lambda: "a" in node.links and node.links["a"].conn is not None)
    # a dials b as well: a's is the smaller id, so both ends move to a's connection and retire b's.
    second = await asyncio.to_thread(RawPeer(node.route_url, "a", "c1").authenticate)
    link = node.links["a"]
    await eventually(lambda: link.retiring is not None)
    new = link.conn
    assert new is not None
    # The new connection brings four times the bound before the old one's last events arrive (a
    # retransmission, a slow path): what it brought beyond the bound waits, unread.
    second.send(events(1000, 4 * HELD))
    await eventually(lambda: new.stats.frames_in >= HELD)
    dialled.send(events(0, 100))
    dialled.sock.shutdown(socket.SHUT_WR)  # a's end of the retired connection
    await eventually(lambda: len(inbox.numbers) == 100 + 4 * HELD)
    assert inbox.numbers == [*range(100), *range(1000, 1000 + 4 * HELD)]
    assert link.retiring is None
    assert not link.held
    dialled.close()
    second.close()


def spooled(offset: int) -> bytes:
    inner = encode_event("a", "orders.eu", offset, 1000, b"%d" % offset, FLAG_GUARANTEED)
    return encode_frame(FrameType.SPOOLED, "a", sequence=offset, payload=inner)


async def test_guaranteed_events_past_a_gap_in_the_spools_offsets_are_not_confirmed(
    node: MeshNode, listener: socket.socket
) -> None:
    """Confirmations are cumulative: confirming offset 7 after 2 would tell the peer 3 to 6 are
    stored. The link starts over instead, and the peer resends from what was confirmed."""
    peer = await asyncio.to_thread(answer_dial, listener, "a")
    await eventually(lambda: "a" in node.links and node.links["a"].conn is not None)
    peer.send(spooled(0), spooled(1), spooled(2))
    ack = await asyncio.to_thread(peer.read_until, FrameType.ACK)
    while ack.sequence < 2:
        ack = await asyncio.to_thread(peer.read_until, FrameType.ACK)
    peer.send(spooled(7))
    assert await asyncio.to_thread(peer.closed)
    assert [frame.sequence for frame in peer.frames if frame.type is FrameType.ACK] == []
    assert node.guaranteed.counters["spooled_gaps"] == 1
    again = await asyncio.to_thread(answer_dial, listener, "a")  # b dials again: offset 3 comes next
    await eventually(lambda: node.links["a"].conn is not None)
    again.send(spooled(3))
    assert (await asyncio.to_thread(again.read_until, FrameType.ACK)).sequence == 3
    peer.close()
    again.close()
