"""What a node keeps per peer (a link, across that peer's connections) and per connection (its side
of the handshake), and how a link reads in ``GET /mesh``."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from meshplane.core.mesh.frames import FrameType, Hello, InterestChange, encode_frame
from meshplane.core.mesh.interest_frames import InterestBatch
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.holders import ClientSession

LINK_COUNTERS = (
    "dropped_peer_down",
    "dropped_backpressure",
    "unwanted_in",
    "duplicates_in",
    "resyncs",
    "connects",
    "connection_swaps",
    "dead_peer_timeouts",
    "sub_add_out",
    "sub_remove_out",
    "sub_add_in",
    "sub_remove_in",
    "interest_frames_in",  # INTEREST frames: many SUB_ADD / SUB_REMOVE each (counted in those too)
    "bad_frames",
    "outside_dmr",  # a VPN's events that do not cross gateways, arrived from another cluster: dropped
)


@dataclass(eq=False)
class Link:
    """What a node knows of one peer, across that peer's connections."""

    external: ClassVar[bool] = False  # a gateway's link to another cluster (``peer``: its name)
    peer: str
    state: str = "down"  # down -> syncing (interest being learnt) -> up (carries events)
    conn: FrameConnection | None = None
    dialed_by: str = ""
    epoch: int = 0
    last_heard: float = 0.0
    since: float = 0.0  # when the link's current connection began (a swap keeps it)
    was_up: bool = False  # it carried events once (else it is forgotten when it goes down)
    sync_sent: float | None = None  # when the SYNC_REQ now awaiting its answer went out
    address: str = ""
    counters: Counter[str] = field(default_factory=Counter)  # rare events, by name
    events_out: int = 0
    events_in: int = 0
    down: asyncio.Event = field(default_factory=asyncio.Event)  # set while the link is down
    retiring: FrameConnection | None = None  # the connection being switched away from, still read
    held: list[Any] = field(default_factory=list)  # events of the new connection until it is done
    interest_batches: bool = False  # the peer's HELLO: it takes INTEREST frames
    spooled_next: int | None = None  # the spool offset the peer's next SPOOLED frame may have, at most

    def __post_init__(self) -> None:
        self.down.set()


@dataclass(eq=False)
class Handshake:
    """One connection's side of the handshake (:mod:`meshplane.core.mesh.handshake`)."""

    conn: FrameConnection
    dialed: bool
    role: str = ""  # "route", "client" or "gateway" once both sides have proven the secret
    peer: str = ""
    session: ClientSession | None = None
    error: str = ""
    superseded: bool = False
    dial_role: str = "route"  # what a dialled connection says it is: "route" or "gateway"
    nonce: bytes = b""  # this side's challenge
    hello: Hello | None = None  # the other side's HELLO, until its proof is in
    proved: bool = False  # a dialled connection: this side's AUTH went out
    origin: str = ""  # a client's: the source id its EVENTs are to carry
    was_current: bool = False  # a route connection that carried its link (its frames apply)
    address: str | None = None  # an accepted connection's source address, while it is not yet proven
    deadline: asyncio.TimerHandle | None = None  # closes it unless its handshake is over by then


def announce(links: Iterable[Link], source: str, added: bool, pattern: str, version: int) -> None:
    """A SUB_ADD (``added``) or SUB_REMOVE of ``source``'s to each of ``links`` that has a connection:
    in the INTEREST frame being filled to a peer whose HELLO took them (a burst costs it one frame,
    in order), in a frame of its own to any other."""
    frame = change = None
    counter = "sub_add_out" if added else "sub_remove_out"
    for link in links:
        if link.conn is None:
            continue
        if link.interest_batches:
            change = change or InterestChange(added, pattern, version)
            link.conn.send_batched(change, partial(InterestBatch, source))
        else:
            kind = FrameType.SUB_ADD if added else FrameType.SUB_REMOVE
            frame = frame or encode_frame(kind, source, pattern, version)
            link.conn.send(frame)
        link.counters[counter] += 1


def peer_address(transport: asyncio.BaseTransport | None) -> str:
    """``host:port`` (``[host]:port`` for IPv6) of a connection's peer, as dashboards and logs show it."""
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not isinstance(peer, tuple) or len(peer) < 2:
        return str(peer or "")
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def link_status(link: Link, patterns_remote: int, bloom_false_positives: int) -> dict[str, Any]:
    live = link.conn.stats if link.conn is not None else None
    return {
        "peer": link.peer,
        "state": link.state,
        "address": link.address,
        "dialed_by": link.dialed_by,
        "connected_secs": round(time.monotonic() - link.since, 3) if link.conn is not None else 0.0,
        "patterns_remote": patterns_remote,
        "bloom_false_positives": bloom_false_positives,
        **{
            name: link.counters[name] + (getattr(live, name) if live else 0)
            for name in ("bytes_in", "bytes_out", "batches_out")
        },
        "events_out": link.events_out,
        "events_in": link.events_in,
        **{name: link.counters[name] for name in LINK_COUNTERS},
    }
