"""ZeroMQ broker mode: publishers and subscribers meet at XSUB/XPUB brokers instead of connecting directly.

Publishers send through every broker (or ``broker_fanout`` of them, chosen by rendezvous hashing),
subscribers listen to all of them and drop the copies by ``(publisher_id, sequence)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from meshplane.aio import cancel_and_wait
from meshplane.core.brokers import (
    BROKERS_BUCKET,
    BrokerAddress,
    DedupCache,
    parse_broker_record,
    select_brokers,
)
from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import WireFormat
from meshplane.core.snapshots import Added
from meshplane.discovery.base import Discovery
from meshplane.errors import ConfigError, InvalidDiscoveryRecord
from meshplane.transports.base import Received
from meshplane.transports.curve import Curve
from meshplane.transports.zmq import XPubPublisher, ZmqSubscriberTransport
from meshplane.transports.zmq_readable import Readable

log = logging.getLogger(__name__)
_MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED


def _broker_key(curve: Curve) -> bytes:
    if curve.broker_key is None:
        raise ConfigError("broker mode with CURVE needs the brokers' key: MESHPLANE_ZMQ_CURVE_BROKER_KEY")
    return curve.broker_key


class BrokerDirectory:
    """The brokers in use: fixed (DYN_ZMQ_BROKER_URL) or followed in discovery (DYN_ZMQ_BROKER_ENABLED)."""

    def __init__(self, static: tuple[BrokerAddress, ...]) -> None:
        self.brokers: dict[str, BrokerAddress] = {b.key: b for b in static}
        self._listeners: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self.invalid_records = 0

    async def follow(self, discovery: Discovery) -> None:
        """Take the brokers registered in discovery now, and keep following them."""
        for key, value in (await discovery.list(BROKERS_BUCKET + "/")).items():
            self._apply(key, value)
        self._task = asyncio.create_task(self._watch(discovery), name="meshplane-broker-watch")

    def _apply(self, key: str, value: bytes | None) -> None:
        try:
            address = parse_broker_record(value) if value is not None else None
        except InvalidDiscoveryRecord as exc:
            self.invalid_records += 1
            log.warning("skipping broker record %s: %s", key, exc)
            address = None
        if self.brokers.get(key) == address:
            return
        if address is None:
            self.brokers.pop(key, None)
            log.info("broker %s left", key)
        else:
            self.brokers[key] = address
            log.info("broker %s found: xsub %s, xpub %s", key, address.xsub, address.xpub)
        for listener in list(self._listeners):
            listener()

    async def _watch(self, discovery: Discovery) -> None:
        async for event in discovery.list_and_watch(BROKERS_BUCKET + "/"):
            self._apply(event.key, event.value if isinstance(event, Added) else None)

    def listen(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def unlisten(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    async def close(self) -> None:
        await cancel_and_wait(self._task)


class ConnectionMonitor:
    """Reports a socket's connections to brokers: connected, lost, still unreachable (once each)."""

    def __init__(self, sock: zmq.Socket[bytes], role: str) -> None:
        self.connected: set[str] = set()
        self._role = role
        self._retrying: set[str] = set()
        self._monitor = sock.get_monitor_socket(_MONITORED)
        self._readable = Readable(self._monitor)
        self._task = asyncio.create_task(self._run(), name=f"meshplane-{role}-monitor")

    async def _run(self) -> None:
        while True:
            await self._readable.wait()
            while True:
                try:
                    event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                endpoint = (
                    event["endpoint"].decode() if isinstance(event["endpoint"], bytes) else event["endpoint"]
                )
                if event["event"] == zmq.EVENT_CONNECTED:
                    self.connected.add(endpoint)
                    self._retrying.discard(endpoint)
                    log.info("%s connected to broker %s", self._role, endpoint)
                elif event["event"] == zmq.EVENT_DISCONNECTED:
                    self.connected.discard(endpoint)
                    log.warning("%s lost broker %s; reconnecting", self._role, endpoint)
                elif endpoint not in self._retrying:
                    self._retrying.add(endpoint)
                    log.warning("%s cannot reach broker %s yet; retrying", self._role, endpoint)

    async def close(self, sock: zmq.Socket[bytes]) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._readable.close()
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        self._monitor.close(0)


def _reconcile(
    sock: zmq.Socket[bytes],
    connected: dict[str, str],
    wanted: dict[str, str],
    disconnect: Callable[[str], None] | None = None,
) -> None:
    """Connect ``sock`` to exactly the ``wanted`` endpoints (by broker key); ``connected`` is updated.
    ``disconnect``: how to leave an endpoint (a subscriber's own, safe one), ``sock.disconnect`` if None."""
    for key, endpoint in list(connected.items()):
        if wanted.get(key) != endpoint:
            with contextlib.suppress(zmq.ZMQError):
                (disconnect or sock.disconnect)(endpoint)
            del connected[key]
    for key, endpoint in wanted.items():
        if key in connected:
            continue
        try:
            sock.connect(endpoint)  # ZeroMQ keeps retrying in the background until the broker is there
        except zmq.ZMQError as exc:
            log.warning("cannot connect to broker endpoint %r: %s", endpoint, exc)
            continue
        connected[key] = endpoint


class ZmqBrokerPublisherTransport(XPubPublisher):
    """Connects to the XSUB side of its brokers; frame0 is the full subject, as in Dynamo."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        directory: BrokerDirectory,
        subject: bytes,
        publisher_id: int,
        sndhwm: int,
        wire: WireFormat,
        codec: Codec,
        fanout: int,
        curve: Curve | None = None,
        wait_when_full: bool = False,
        envelope_topic: str | None = None,
        identity: int | None = None,
    ) -> None:
        super().__init__(
            context, subject, publisher_id, sndhwm, wire, codec, curve, wait_when_full, envelope_topic
        )
        self._identity = publisher_id if identity is None else identity  # stable across lives: HRW's key
        self._directory = directory
        self._fanout = fanout
        self._connected: dict[str, str] = {}  # broker key -> xsub endpoint
        self._monitor: ConnectionMonitor | None = None

    async def start(self) -> None:
        self._socket = self._open()
        if self._curve is not None:
            self._curve.client(self._socket, _broker_key(self._curve))
        # Only live connections get a queue: events are not parked for a dead broker (the others carry
        # them), and a lost broker's subscriptions are withdrawn, so subscriber counts stay true.
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._monitor = ConnectionMonitor(self._socket, "publisher")
        self._directory.listen(self._rebalance)
        self._rebalance()
        self._routes.check()

    def _rebalance(self) -> None:
        if self._socket is None:
            return
        chosen = select_brokers(self._identity, list(self._directory.brokers.values()), self._fanout)
        wanted = {b.key: b.xsub for b in chosen}
        _reconcile(self._socket, self._connected, wanted)
        if not wanted:
            log.warning("publisher %x has no broker to send through; events are dropped", self._publisher_id)

    def discovery_transport(self) -> None:
        return None  # as in Dynamo: brokers are registered, publishers are not

    @property
    def brokers(self) -> list[str]:
        """The XSUB endpoints this publisher sends through (its rendezvous choice)."""
        return sorted(self._connected.values())

    async def close(self) -> None:
        self._directory.unlisten(self._rebalance)
        if self._monitor is not None and self._socket is not None:
            await self._monitor.close(self._socket)
        await super().close()


class ZmqBrokerSubscriberTransport(ZmqSubscriberTransport):
    """Connects to the XPUB side of every broker and drops the copies each extra broker delivers."""

    publisher_discovery = "none"
    takes_batches = False  # broker-mode publishers send event by event

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        directory: BrokerDirectory,
        subject: bytes,
        rcvhwm: int,
        max_bytes: int,
        dedup_capacity: int,
        curve: Curve | None = None,
        busy_poll: float = 0.0,
    ) -> None:
        super().__init__(context, subject, rcvhwm, max_bytes, curve, busy_poll=busy_poll)
        self._directory = directory
        self._dedup = DedupCache(dedup_capacity)
        self._brokers: dict[str, str] = {}
        self._monitor: ConnectionMonitor | None = None

    async def start(self) -> None:
        await super().start()
        assert self._socket is not None
        if self._curve is not None:
            self._curve.client(self._socket, _broker_key(self._curve))
        self._monitor = ConnectionMonitor(self._socket, "subscriber")
        self._directory.listen(self._follow_brokers)
        self._follow_brokers()

    def _follow_brokers(self) -> None:
        if self._socket is None:
            return
        wanted = {key: b.xpub for key, b in self._directory.brokers.items()}
        _reconcile(self._socket, self._brokers, wanted, self.disconnect)

    @property
    def paths(self) -> int:
        return len(self._brokers)  # every broker carries every event (fanout aside): any may be faster

    @property
    def duplicates_dropped(self) -> int:  # type: ignore[override]
        return self._dedup.duplicates

    def add_publisher(self, channel: Any) -> None:
        return None

    def remove_publisher(self, channel: Any) -> None:
        return None

    async def receive(self) -> list[Received]:
        first_time = self._dedup.first_time
        while True:
            batch = await super().receive()
            # Events under our topic come back bare; heartbeats (Frames) skip deduplication: they carry
            # the *next* sequence, which must not shadow its event. Other topics' events are filtered later.
            unique = [
                item
                for item in batch
                if not isinstance(item, EventEnvelope) or first_time(item.publisher_id, item.sequence)
            ]
            if unique or not batch:
                return unique

    async def close(self) -> None:
        self._directory.unlisten(self._follow_brokers)
        if self._monitor is not None and self._socket is not None:
            await self._monitor.close(self._socket)
        await super().close()
