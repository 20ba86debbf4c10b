"""ZeroMQ direct mode (pyzmq): each publisher binds its own socket, subscribers connect to every one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import zmq
import zmq.asyncio

from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import WireFormat, ZmqEncoder, decode_zmq
from meshplane.core.records import TRANSPORT_ZMQ, EventChannel
from meshplane.errors import TransportError, WireError
from meshplane.transports.base import PublisherTransport, Received, SubscriberTransport

log = logging.getLogger(__name__)
_MAX_BATCH = 4096
# Sends through the synchronous shadow socket can swallow the edge that would wake the asyncio
# reader, so readers of control traffic also wake up on this period.
_CONTROL_POLL_MS = 100


def _tcp_url(host: str) -> str:
    return f"tcp://[{host}]:*" if ":" in host else f"tcp://{host}:*"


class ZmqPublisherTransport(PublisherTransport):
    """An XPUB socket: on the wire a PUB, but it also sees subscriptions, so it can count subscribers."""

    def __init__(
        self,
        context: zmq.asyncio.Context,
        routing_topic: bytes,
        publisher_id: int,
        host: str,
        sndhwm: int,
        wire: WireFormat,
        codec: Codec,
    ) -> None:
        self._context = context
        self._routing_topic = routing_topic
        self._encoder = ZmqEncoder(routing_topic, publisher_id, wire, codec)
        self._host = host
        self._sndhwm = sndhwm
        self._socket: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None
        self._endpoint = ""
        self._subscribers = 0
        self._control: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = self._context.socket(zmq.XPUB)
        sock.setsockopt(zmq.SNDHWM, self._sndhwm)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscribe, so counts stay exact
        try:
            sock.bind(_tcp_url(self._host))
        except zmq.ZMQError as exc:
            sock.close(0)
            raise TransportError(
                f"cannot bind a ZMQ socket on {self._host} (DYN_EVENT_PLANE_HOST): {exc}"
            ) from exc
        port = sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._endpoint = f"tcp://{host}:{port}"
        self._socket = sock
        self._sync = zmq.Socket.shadow(sock.underlying)
        self._control = asyncio.create_task(self._read_subscriptions(), name="meshplane-xpub-control")

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def discovery_transport(self) -> tuple[str, dict[str, Any]]:
        return TRANSPORT_ZMQ, {"endpoint": self._endpoint}

    def _drain_subscriptions(self) -> None:
        assert self._sync is not None
        while True:
            try:
                message = self._sync.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[1:] == self._routing_topic or (
                message[1:] and self._routing_topic.startswith(message[1:])
            ):
                self._subscribers += 1 if message[:1] == b"\x01" else -1

    async def _read_subscriptions(self) -> None:
        assert self._socket is not None
        with contextlib.suppress(zmq.ZMQError):
            while True:
                self._drain_subscriptions()
                await self._socket.poll(_CONTROL_POLL_MS)

    def subscriber_count(self) -> int:
        return self._subscribers

    async def send(self, envelope: EventEnvelope) -> None:
        assert self._sync is not None
        # XPUB never blocks: at the high-water mark ZeroMQ drops, which subscribers see as a gap.
        self._sync.send_multipart(self._encoder.encode(envelope), zmq.NOBLOCK, copy=False)

    async def flush(self, timeout: float) -> None:
        return None  # ZeroMQ's I/O thread sends on its own; LINGER covers close

    async def close(self) -> None:
        if self._control is not None:
            self._control.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._control
        if self._socket is not None:
            self._socket.close()
            self._socket = None
            self._sync = None


class ZmqSubscriberTransport(SubscriberTransport):
    """One SUB socket connected to every discovered publisher of the topic."""

    def __init__(
        self, context: zmq.asyncio.Context, routing_topic: bytes, rcvhwm: int, max_bytes: int
    ) -> None:
        self._context = context
        self._routing_topic = routing_topic
        self._rcvhwm = rcvhwm
        self._max_bytes = max_bytes
        self._socket: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None
        self._endpoints: dict[int, str] = {}
        self.connect_errors = 0

    async def start(self) -> None:
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # SUB filtering is a prefix match; the subscriber re-checks the topic exactly.
        sock.setsockopt(zmq.SUBSCRIBE, self._routing_topic)
        self._socket = sock
        self._sync = zmq.Socket.shadow(sock.underlying)

    @property
    def connected_publishers(self) -> int:
        return len(self._endpoints)

    def add_publisher(self, channel: EventChannel) -> None:
        endpoint = channel.zmq_endpoint
        if endpoint is None:
            log.warning(
                "publisher %x of %s is not a ZMQ publisher (%s); not connecting",
                channel.instance_id,
                channel.topic,
                channel.transport_kind,
            )
            return
        if self._endpoints.get(channel.instance_id) == endpoint or self._sync is None:
            return
        self.remove_publisher(channel)
        try:
            # ZeroMQ connects (and reconnects) in the background: a publisher that is not up yet
            # is picked up when it is, so one failed attempt never silences it.
            self._sync.connect(endpoint)
        except zmq.ZMQError as exc:
            self.connect_errors += 1
            log.warning("cannot connect to publisher %x at %r: %s", channel.instance_id, endpoint, exc)
            return
        self._endpoints[channel.instance_id] = endpoint
        log.debug("connected to publisher %x at %s", channel.instance_id, endpoint)

    def remove_publisher(self, channel: EventChannel) -> None:
        endpoint = self._endpoints.pop(channel.instance_id, None)
        if endpoint is not None and self._sync is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sync.disconnect(endpoint)
            # The connection only closes once this socket processes the termination handshake, which
            # otherwise waits for the application's next read; nudge it so the publisher sees us go.
            loop = asyncio.get_running_loop()
            for delay in (0.01, 0.1, 0.5):
                loop.call_later(delay, self._process_commands)
            log.debug("disconnected from publisher %x at %s", channel.instance_id, endpoint)

    def _process_commands(self) -> None:
        if self._sync is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sync.getsockopt(zmq.EVENTS)

    async def receive(self) -> list[Received]:
        assert self._socket is not None
        assert self._sync is not None
        out: list[Received] = []
        while not out:
            await self._socket.poll(None)
            recv = self._sync.recv_multipart
            for _ in range(_MAX_BATCH):
                try:
                    frames = recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    out.append(decode_zmq(frames, self._max_bytes))
                except WireError as exc:
                    out.append(exc)
        return out

    async def close(self) -> None:
        if self._socket is not None:
            self._socket.close(0)
            self._socket = None
            self._sync = None
