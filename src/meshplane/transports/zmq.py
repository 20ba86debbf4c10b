"""ZeroMQ direct mode (pyzmq): each publisher binds its own socket, subscribers connect to every one.

Sockets are plain (synchronous) pyzmq sockets: sends never block (PUB semantics) and the receive side
waits on the socket's notification descriptor through the event loop, then drains without awaiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Callable
from typing import Any

import zmq

from meshplane.core.batches import BATCH_BYTES, SubscriptionTally, batch_topic, decode_batch
from meshplane.core.envelope import Codec, EventEnvelope, msgpack_envelope_decoder
from meshplane.core.framing import MessageType, WireFormat, ZmqEncoder, decode_header8_event, max_frame_bytes
from meshplane.core.records import TRANSPORT_ZMQ, EventChannel
from meshplane.errors import TransportError, WireError
from meshplane.transports.base import PublisherTransport, Received, SubscriberTransport
from meshplane.transports.curve import Curve
from meshplane.transports.native import NativeReceive, expected_envelope, native_receive, native_sender
from meshplane.transports.zmq_messages import ListSender, decode_frames, direct_send, read_subscriptions
from meshplane.transports.zmq_readable import Readable
from meshplane.transports.zmq_routes import RouteWatch

log = logging.getLogger(__name__)
_MAX_BATCH = 4096
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_NOBLOCK = int(zmq.NOBLOCK)
_decode_map = msgpack_envelope_decoder.decode
#: Seconds a removed publisher's connection stays open (unless its goodbye comes first): what it sent
#: before closing, still on the way, gets here (its own socket lingers as long, then gives up).
LEAVING_LINGER = 1.0


def _tcp_url(host: str) -> str:
    return f"tcp://[{host}]:*" if ":" in host else f"tcp://{host}:*"


class XPubPublisher(PublisherTransport):
    """An XPUB socket: on the wire a PUB, but it also sees subscriptions, so it can count subscribers.

    Subclasses decide where it goes: bound on its own port (direct mode) or connected to brokers.
    """

    #: Whether lists may go as batch messages (direct mode: the subscriptions seen are the subscribers')
    sends_batches = False

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        routing_topic: bytes,
        publisher_id: int,
        sndhwm: int,
        wire: WireFormat,
        codec: Codec,
        curve: Curve | None = None,
        wait_when_full: bool = False,
        envelope_topic: str | None = None,
    ) -> None:
        self._context = context
        self._curve = curve
        self._routing_topic = routing_topic
        self._publisher_id = publisher_id
        # the publisher's topic: with it the compiled sender builds the envelopes itself
        self._envelope_topic = envelope_topic
        self._encoder = ZmqEncoder(routing_topic, publisher_id, wire, codec)
        self._sndhwm = sndhwm
        self._wait_when_full = wait_when_full
        self._socket: zmq.Socket[bytes] | None = None
        self._subscriptions = SubscriptionTally(routing_topic)
        self._send_event: Callable[[EventEnvelope], None] = self._send_closed
        #: Times a publish found a subscriber's queue full and waited (``wait_when_full``).
        self.waits = 0
        self._routes = RouteWatch(self)

    def _open(self) -> zmq.Socket[bytes]:
        sock = self._context.socket(zmq.XPUB)
        sock.setsockopt(zmq.SNDHWM, self._sndhwm)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscribe, so counts stay exact
        # At the high-water mark XPUB drops, which subscribers see as a gap; with XPUB_NODROP it refuses
        # the whole message instead (EAGAIN on its first frame), and ``send`` waits for room.
        # Frame by frame: pyzmq's send_multipart re-validates every frame, which costs more than the send.
        self._send_event = self._encoder.event_sender(direct_send(sock), _MORE, zmq.NOBLOCK)
        if self._envelope_topic is not None:
            senders = native_sender(
                sock,
                self._routing_topic,
                self._publisher_id,
                self._envelope_topic,
                self._encoder.wire,
                self._encoder.codec,
            )
            if senders is not None:
                self.send_payload, self.send_payloads = senders.one, senders.many
                if self.sends_batches:
                    self.send_payloads = ListSender(sock, self._subscriptions, senders.many, senders.batches)
        if self._wait_when_full:
            sock.setsockopt(zmq.XPUB_NODROP, 1)
            self.send_now = None  # publish awaits send(), which can wait
        else:
            self.send_now = self._send_event
        return sock

    def subscriber_count(self) -> int:
        if self._socket is not None:
            read_subscriptions(self._socket, self._subscriptions)
        # Exact match: in broker mode a subscriber of `kv` must not count for `kv-events`.
        return self._subscriptions.plain

    def _send_closed(self, envelope: EventEnvelope) -> None:
        raise TransportError("ZMQ publisher socket is closed")

    async def send(self, envelope: EventEnvelope) -> None:
        try:
            self._send_event(envelope)
        except zmq.Again:  # only with XPUB_NODROP: a subscriber's queue is full
            await self._send_when_room(envelope)

    async def send_many(self, envelopes: list[EventEnvelope]) -> None:
        send_event = self._send_event
        for envelope in envelopes:
            try:
                send_event(envelope)
            except zmq.Again:
                await self._send_when_room(envelope)

    async def _send_when_room(self, envelope: EventEnvelope) -> None:
        # XPUB cannot signal room (its POLLOUT is always set): retry, backing off to 10 ms. A cancelled
        # publish sends nothing.
        self.waits += 1
        delay = 0.0001
        while True:
            await asyncio.sleep(delay)
            try:
                self._send_event(envelope)
                return
            except zmq.Again:
                delay = min(delay * 2, 0.01)

    async def send_heartbeat(self, envelope: EventEnvelope) -> None:
        self._routes.check()
        if self._socket is not None:
            with contextlib.suppress(zmq.Again):  # a full queue (XPUB_NODROP): the next one will do
                self._socket.send_multipart(
                    self._encoder.encode(envelope, MessageType.HEARTBEAT), zmq.NOBLOCK
                )

    async def flush(self, timeout: float) -> None:
        return None  # ZeroMQ's I/O thread sends on its own; LINGER covers close

    async def close(self) -> None:
        self._send_event = self._send_closed
        self.send_payload = self.send_payloads = None  # they hold the socket's address
        if self.send_now is not None:
            self.send_now = self._send_closed
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class ZmqPublisherTransport(XPubPublisher):
    """Direct mode: bound on an OS-assigned port of ``host``, advertised in discovery."""

    sends_batches = True

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        routing_topic: bytes,
        publisher_id: int,
        host: str,
        sndhwm: int,
        wire: WireFormat,
        codec: Codec,
        curve: Curve | None = None,
        wait_when_full: bool = False,
        envelope_topic: str | None = None,
    ) -> None:
        super().__init__(
            context, routing_topic, publisher_id, sndhwm, wire, codec, curve, wait_when_full, envelope_topic
        )
        self._host = host
        self._endpoint = ""

    async def start(self) -> None:
        sock = self._open()
        if self._curve is not None:
            self._curve.serve(sock)
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
        self._routes.check()

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def discovery_transport(self) -> tuple[str, dict[str, Any]]:
        config: dict[str, Any] = {"endpoint": self._endpoint}
        if self._curve is not None:  # only then: Dynamo's records stay as they are
            config["curve_public_key"] = self._curve.public.decode()
        return TRANSPORT_ZMQ, config


class ZmqSubscriberTransport(SubscriberTransport):
    """One SUB socket connected to every discovered publisher of the topic."""

    publisher_discovery = "required"
    #: Whether it subscribes to batch messages too (with the compiled receive, which reads them)
    takes_batches = True

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        routing_topic: bytes,
        rcvhwm: int,
        max_bytes: int,
        curve: Curve | None = None,
        envelope_topic: str | None = None,
        busy_poll: float = 0.0,
    ) -> None:
        self._context = context
        self._curve = curve
        self._server_keys: dict[int, bytes] = {}
        self.untrusted_publishers = 0  # records refused: no CURVE key, or one not trusted
        self._routing_topic = routing_topic
        self._rcvhwm = rcvhwm
        self._busy_poll = busy_poll
        self._max_bytes = max_bytes
        self._socket: zmq.Socket[bytes] | None = None
        self._readable: Readable | None = None
        self._one_at_a_time = False
        self._native: NativeReceive | None = None
        # what the compiled receive reads itself and vouches for as runs (batch_run)
        self._expected = None if envelope_topic is None else expected_envelope(envelope_topic)
        self._kept: list[Received] = []  # received before a disconnect, for the next receive()
        self._batch_topic: bytes | None = None  # subscribed to batch messages under this topic
        self._endpoints: dict[int, str] = {}
        # removed from discovery, connected until their goodbye or LEAVING_LINGER
        self._leaving: dict[int, tuple[str, asyncio.TimerHandle]] = {}

    async def start(self) -> None:
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # libzmq drops a peer whose frame is larger before buffering it, rather than after
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes(self._max_bytes))
        # SUB filtering is a prefix match; the subscriber re-checks the topic exactly.
        sock.setsockopt(zmq.SUBSCRIBE, self._routing_topic)
        self._native = native_receive()
        if (
            self._native is not None
            and self.takes_batches
            and max_frame_bytes(self._max_bytes) >= BATCH_BYTES
        ):
            self._batch_topic = batch_topic(self._routing_topic)
            sock.setsockopt(zmq.SUBSCRIBE, self._batch_topic)
        if self._curve is not None:
            self._curve.client(sock)
        self._socket = sock
        self._readable = Readable(sock, self._busy_poll)

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
        if self._endpoints.get(channel.instance_id) == endpoint or self._socket is None:
            return
        self._drop(self._endpoints.pop(channel.instance_id, None))
        for publisher_id, (old, _) in list(self._leaving.items()):
            if old == endpoint:  # its port, taken by a new publisher: the old one is gone for good
                self._leave(publisher_id)
        if self._curve is not None and not self._trust(channel):
            return
        try:
            # ZeroMQ connects (and reconnects) in the background: a publisher that is not up yet
            # is picked up when it is, so one failed attempt never silences it.
            self._socket.connect(endpoint)
        except zmq.ZMQError as exc:
            log.warning("cannot connect to publisher %x at %r: %s", channel.instance_id, endpoint, exc)
            return
        self._endpoints[channel.instance_id] = endpoint
        log.debug("connected to publisher %x at %s", channel.instance_id, endpoint)

    def _trust(self, channel: EventChannel) -> bool:
        """With CURVE: connect only to a publisher whose key we trust, and check that key on connect."""
        assert self._curve is not None
        assert self._socket is not None
        key = channel.zmq_curve_key
        if key is None or not self._curve.trusts(key):
            self.untrusted_publishers += 1
            log.warning(
                "not connecting to publisher %x of %s: %s",
                channel.instance_id,
                channel.topic,
                "its record has no CURVE key" if key is None else "its CURVE key is not an allowed one",
            )
            return False
        self._socket.curve_serverkey = key  # read by the next connect()
        self._server_keys[channel.instance_id] = key
        return True

    def unread(self) -> bool:
        if self._kept:
            return True
        try:
            return self._readable is not None and self._readable.poll()
        except zmq.ZMQError:  # closed meanwhile
            return False

    def reconnect_publisher(self, publisher_id: int) -> None:
        # Tango's keep-alive: a silent peer may be a half-open connection; start a fresh one.
        endpoint = self._endpoints.get(publisher_id)
        if endpoint is not None and self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.disconnect(endpoint)
                if publisher_id in self._server_keys:
                    self._socket.curve_serverkey = self._server_keys[publisher_id]
                self._socket.connect(endpoint)
                log.info("reconnecting to silent publisher %x at %s", publisher_id, endpoint)

    def remove_publisher(self, channel: EventChannel) -> None:
        """Its record is gone: its connection stays until its goodbye or :data:`LEAVING_LINGER`."""
        publisher_id = channel.instance_id
        endpoint = self._endpoints.pop(publisher_id, None)
        if endpoint is not None and self._socket is not None:
            timer = asyncio.get_running_loop().call_later(LEAVING_LINGER, self._leave, publisher_id)
            self._leaving[publisher_id] = (endpoint, timer)

    def publisher_left(self, publisher_id: int) -> None:
        # Only once its record went: a goodbye proves nothing (anyone on the topic can send one with its
        # id, and dropping its connection then silenced a live publisher); the record's removal does.
        if publisher_id in self._leaving:
            self._leave(publisher_id)

    def _leave(self, publisher_id: int) -> None:
        endpoint, timer = self._leaving.pop(publisher_id, (None, None))
        if timer is not None:
            timer.cancel()
        self._drop(endpoint)

    def _drop(self, endpoint: str | None) -> None:
        if endpoint is not None and self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.disconnect(endpoint)
                log.debug("disconnected from publisher at %s", endpoint)

    def disconnect(self, endpoint: str) -> None:
        """``socket.disconnect`` without losing the removed connection's queue (libzmq throws it away):
        what waits (up to the high-water mark's worth) is received first, kept for ``receive``. Also
        safe: reading ``ZMQ_EVENTS`` (``Readable``) makes libzmq fetch the next message's first frame,
        and if its connection is removed, libzmq 4.3.5 aborts at the next receive (fq.cpp ``!_more``)."""
        assert self._socket is not None
        kept = 0
        for _ in range(max(self._rcvhwm, _MAX_BATCH)):
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            decoded = self._decode(frames)
            self._kept += decoded
            kept += len(decoded)
        if kept and self._readable is not None:
            self._readable.wake()  # a waiting receive() returns them, ahead of what comes next
        self._socket.disconnect(endpoint)

    async def receive(self) -> list[Received]:
        self.batch_run = None
        if self._kept:
            kept, self._kept = self._kept, []
            return kept
        if self._native is not None:
            return await self._receive_native(self._native)
        if self._socket is None or self._readable is None:
            return []  # closed
        recv = self._socket.recv
        routing_topic = self._routing_topic
        max_bytes = self._max_bytes
        out: list[Received] = []
        append = out.append
        readable = self._readable
        while not out:
            await readable.wait()
            if self._kept:
                kept, self._kept = self._kept, []
                return kept
            # When messages come one at a time (the last batch was one), asking ZMQ_EVENTS after the
            # first is cheaper than the EAGAIN exception that would end the batch.
            ask = self._one_at_a_time
            for n in range(_MAX_BATCH):
                if ask and n == 1 and not readable.readable():
                    break
                # Frame.more instead of recv_multipart: its RCVMORE getsockopt per frame costs more
                # than the receive itself.
                try:
                    frame = recv(_NOBLOCK, copy=False)
                except zmq.Again:
                    break
                first = frame.bytes
                if frame.more:
                    frame = recv(_NOBLOCK, copy=False)
                    if not frame.more and first == routing_topic:
                        # the 8-byte-header layout under our own topic: no list, the event comes back bare
                        try:
                            append(decode_header8_event(frame.bytes, routing_topic, max_bytes))
                        except WireError as exc:
                            append(exc)
                        continue
                    frames = [first, frame.bytes]
                    while frame.more:
                        frame = recv(_NOBLOCK, copy=False)
                        frames.append(frame.bytes)
                else:
                    frames = [first]
                append(decode_frames(frames, routing_topic, max_bytes))
        self._one_at_a_time = len(out) == 1
        return out

    async def _receive_native(self, native: NativeReceive) -> list[Received]:
        """As ``receive``, with the compiled loop: it returns the common events decoded and everything
        else as frames, decoded here by the same functions as the pyzmq path."""
        while True:
            if self._socket is None or self._readable is None:
                return []  # closed
            await self._readable.wait()
            if self._socket is None:
                return []  # closed while waiting: the socket's address is no longer valid
            if self._kept:
                kept, self._kept = self._kept, []
                return kept
            out: list[Any] = []
            unusual, error, self.batch_run = native(
                self._socket.underlying,
                self._routing_topic,
                self._max_bytes,
                _MAX_BATCH,
                _decode_map,
                out,
                self._expected,
                self._batch_topic,
            )
            if unusual:
                out = [
                    decoded
                    for item in out
                    for decoded in (self._decode(item) if type(item) is list else (item,))
                ]
            if out:
                return out
            if error not in (0, errno.EAGAIN, errno.EINTR):
                raise zmq.ZMQError(error)

    def _decode(self, frames: list[bytes]) -> list[Received]:
        """A message as the Python decoders read it: a batch message's events, or the one item."""
        if len(frames) == 2 and frames[0] == self._batch_topic:
            return decode_batch(frames[1], self._routing_topic, self._max_bytes)
        return [decode_frames(frames, self._routing_topic, self._max_bytes)]

    async def close(self) -> None:
        for _, timer in self._leaving.values():
            timer.cancel()
        self._leaving.clear()
        if self._readable is not None:
            self._readable.close()
            self._readable = None
        if self._socket is not None:
            self._socket.close(0)
            self._socket = None
