"""A client's propagated ping (``flush(propagated=True)``) waits for every linked peer: when a link
moves to another connection (both ends dialled at once), the pings the peer has not answered go again
on the new one, since the peer ignores whatever came on the connection it did not keep."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from meshplane.core.mesh.frames import FLAG_PROPAGATED, Frame, FrameReader, FrameType, encode_frame
from meshplane.mesh.clients import Clients
from meshplane.mesh.config import PeerLimits
from meshplane.mesh.holders import ClientSession


class Conn:
    def __init__(self) -> None:
        self.sent: list[Frame] = []
        self.is_open = True
        self.reader = FrameReader()

    def send(self, raw: bytes) -> None:
        self.sent.extend(cast(list[Frame], self.reader.feed(raw)))


def node_with_peer(conn: Conn) -> Any:
    link = SimpleNamespace(conn=conn)
    return SimpleNamespace(node_id="b", links={"a": link}, config=SimpleNamespace(limits=PeerLimits()))


def ping(sequence: int) -> Frame:
    raw = encode_frame(FrameType.SYNC_REQ, "", sequence=sequence, flags=FLAG_PROPAGATED)
    frame = FrameReader().feed(raw)[0]
    assert isinstance(frame, Frame)
    return frame


def test_a_ping_waits_for_the_peer_and_goes_again_on_the_links_new_connection() -> None:
    old, new, client = Conn(), Conn(), Conn()
    node = node_with_peer(old)
    clients = Clients(node)
    session = ClientSession("c1", cast(Any, client), cast(Any, None))
    clients.on_frame(session, ping(7))
    assert client.sent == []  # waits for peer a
    (forwarded,) = old.sent
    assert forwarded.type is FrameType.SYNC_REQ
    node.links["a"].conn = new  # the pair moved: a ignores what came on the old connection
    clients.resend_pings("a")
    assert [(f.type, f.sequence) for f in new.sent] == [(FrameType.SYNC_REQ, forwarded.sequence)]
    clients.pong("a", forwarded.sequence)
    clients.pong("a", forwarded.sequence)  # the first copy answered too: ignored
    assert [(f.type, f.sequence) for f in client.sent] == [(FrameType.SYNC_RESP, 7)]
    clients.resend_pings("a")  # nothing waits any more
    assert len(new.sent) == 1
