"""``EventPlane``: owns the configuration and the connections publishers and subscribers share."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from meshplane.callbacks import CallbackSubscriptions, EventCallback
from meshplane.config import PlaneConfig
from meshplane.core.names import Scope, validate_name
from meshplane.core.records import new_instance_id, publisher_identity
from meshplane.discovery import Discovery, create_discovery
from meshplane.errors import ClosedError, ConfigError, DiscoveryError, SubscriptionError
from meshplane.membership import Membership, PlaneMember
from meshplane.publisher import EventPublisher
from meshplane.subscriber import EventSubscriber
from meshplane.transports import create_publisher_transport, create_subscriber_transport
from meshplane.transports.base import PublisherTransport, SubscriberTransport
from meshplane.transports.curve import Curve
from meshplane.transports.zmq_broker import BrokerDirectory

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

    from meshplane.mesh.client import MeshClient
    from meshplane.plane_metrics import MetricsEndpoint

log = logging.getLogger(__name__)
_MAX_ZMQ_SOCKETS = 65_536


@contextlib.asynccontextmanager
async def _closed_on_failure(transport: PublisherTransport | SubscriberTransport) -> AsyncIterator[None]:
    try:
        yield
    except BaseException:
        await transport.close()
        raise


class EventPlane:
    """One deployment's event plane as seen from this process.

    ``EventPlane()`` reads the environment; pass a :class:`PlaneConfig` or keyword overrides to
    configure it in code. Publishers and subscribers made from one plane share its NATS connection,
    ZeroMQ context and discovery lease; ``close()`` (or ``async with``) closes all of them.
    """

    def __init__(self, config: PlaneConfig | None = None, **overrides: Any) -> None:
        if config is None:
            config = PlaneConfig.from_env(**overrides)
        elif overrides:
            config = config.replace(**overrides)
        self.config = config
        self._discovery: Discovery | None = None
        self._nats: NatsClient | None = None
        self._mesh: MeshClient | None = None
        self._zmq: zmq.Context[zmq.Socket[bytes]] | None = None
        self._zap: ThreadAuthenticator | None = None
        self._brokers: BrokerDirectory | None = None
        self._lock = asyncio.Lock()
        self._members: list[EventPublisher | EventSubscriber] = []
        self._heartbeats: asyncio.Task[None] | None = None
        self._membership = Membership(config, self.discovery, self._forget)
        self._callbacks = CallbackSubscriptions(
            self.subscriber, self._check_publishers, retry_every=config.heartbeat_period or 1.0
        )
        self._closed = False
        self._metrics: MetricsEndpoint | None = None
        if config.metrics_port is not None:
            from meshplane.plane_metrics import MetricsEndpoint

            self._metrics = MetricsEndpoint(
                self, config.metrics_host, config.metrics_port, config.metrics_publishers
            )

    @property
    def members(self) -> list[EventPublisher | EventSubscriber]:
        """The plane's open publishers and subscribers."""
        return list(self._members)

    @property
    def metrics_url(self) -> str | None:
        """Where this plane serves its Prometheus metrics (MESHPLANE_METRICS_PORT), if it does."""
        return self._metrics.url if self._metrics is not None else None

    async def __aenter__(self) -> EventPlane:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this EventPlane is closed")

    async def discovery(self) -> Discovery:
        """The started discovery backend (created on first use)."""
        self._check_open()
        async with self._lock:
            if self._discovery is None:
                discovery = create_discovery(self.config)
                await discovery.start()
                self._discovery = discovery
            return self._discovery

    async def nats(self) -> NatsClient:
        """The plane's NATS connection (connected on first use)."""
        self._check_open()
        async with self._lock:
            if self._nats is None:
                from meshplane.transports.nats import connect_nats

                self._nats = await connect_nats(
                    self.config.nats_server, self.config.connect_timeout, tls=self.config.nats_tls()
                )
            return self._nats

    async def mesh(self) -> MeshClient:
        """The plane's connection to its mesh node (connected on first use)."""
        self._check_open()
        async with self._lock:
            if self._mesh is None:
                from meshplane.mesh.client import MeshClient

                self._mesh = await MeshClient(
                    self.config.mesh_node,
                    timeout=self.config.connect_timeout,
                    max_payload=self.config.max_message_bytes + 1024,
                    tls=self.config.mesh_tls(),
                    vpn=self.config.mesh_vpn,
                    user=self.config.mesh_user,
                ).connect()
            return self._mesh

    def zmq_context(self) -> zmq.Context[zmq.Socket[bytes]]:
        self._check_open()
        if self._zmq is None:
            self._zmq = zmq.Context()
            # ZeroMQ's default of 1023 sockets is too few for a process with hundreds of publishers.
            self._zmq.set(zmq.MAX_SOCKETS, _MAX_ZMQ_SOCKETS)
            if self.curve is not None:
                self._zap = self.curve.authenticator(self._zmq)
        return self._zmq

    @functools.cached_property
    def curve(self) -> Curve | None:
        """The CURVE keys when MESHPLANE_ZMQ_CURVE_CERT is set (ZeroMQ only)."""
        cfg = self.config
        if cfg.zmq_curve_cert is None:
            return None
        return Curve.load(cfg.zmq_curve_cert, cfg.zmq_curve_allowed, cfg.zmq_curve_broker_key)

    async def broker_directory(self) -> BrokerDirectory:
        """The brokers of broker mode: from DYN_ZMQ_BROKER_URL, or followed in discovery."""
        self._check_open()
        if self._brokers is None:
            directory = BrokerDirectory(self.config.zmq_brokers)
            if self.config.zmq_broker_enabled:
                await directory.follow(await self.discovery())
            self._brokers = directory
        return self._brokers

    async def publisher(self, scope: Scope, topic: str, *, name: str | None = None) -> EventPublisher:
        """A publisher of ``topic`` in ``scope``, registered in discovery (where the transport registers).

        ``name`` names this publisher instance (default: MESHPLANE_PUBLISHER_ID, else the host name; a
        second publisher of the same scope and topic in this plane gets ``#1`` after it, and so on): with
        the scope and topic it makes the publisher's stable identity, so a restarted publisher sends
        through the same brokers.
        """
        self._check_open()
        validate_name("topic", topic)
        name = self._publisher_name(scope, topic, name)
        identity = publisher_identity(name, scope, topic)
        publisher_id = new_instance_id()
        transport = await create_publisher_transport(self, scope, topic, publisher_id, identity)
        async with _closed_on_failure(transport):
            publisher = EventPublisher(
                scope, topic, publisher_id, transport, self._membership, name=name, identity=identity
            )
            await publisher._start()
        self._adopt(publisher)
        return publisher

    def _publisher_name(self, scope: Scope, topic: str, name: str | None) -> str:
        if name is not None:
            if not name.strip():
                raise ConfigError("a publisher's name must not be blank")
            return name
        base = self.config.publisher_name or socket.gethostname()
        taken = {
            m.name
            for m in self._members
            if isinstance(m, EventPublisher) and (m.scope, m.topic) == (scope, topic)
        }
        candidate, n = base, 0
        while candidate in taken:  # the lowest free ordinal: the same after a restart of the same program
            n += 1
            candidate = f"{base}#{n}"
        return candidate

    async def subscriber(self, scope: Scope, topic: str) -> EventSubscriber:
        """A subscriber of ``topic`` in ``scope``, connected to every publisher discovery knows."""
        self._check_open()
        validate_name("topic", topic)
        transport = await create_subscriber_transport(self, scope, topic)
        async with _closed_on_failure(transport):
            subscriber = EventSubscriber(scope, topic, transport, self._membership)
            await subscriber._start()
        self._adopt(subscriber)
        return subscriber

    async def subscribe_event(
        self, scope: Scope, topic: str, callback: EventCallback, *, stateless: bool = False
    ) -> int:
        """Tango-style subscription: ``callback`` gets every event, notice and error; returns an event id.

        ``callback(item)`` may be a plain function or a coroutine function; ``item`` is an
        :class:`EventEnvelope`, a notice (:class:`EventTimeout`, :class:`PublisherRecovered`,
        :class:`EventGap`, :class:`JoinedLate`, :class:`PublisherLeft`) or a :class:`MeshplaneError`.
        Calls never overlap, may subscribe or unsubscribe themselves, and stop before
        :meth:`unsubscribe_event` returns.

        ``stateless=False`` fails at once (:class:`SubscriptionError`) when discovery is unreachable or
        no publisher is registered; ``stateless=True`` always succeeds and connects when it can,
        reporting each failed attempt to the callback.
        """
        self._check_open()
        return await self._callbacks.subscribe(scope, topic, callback, stateless=stateless)

    async def unsubscribe_event(self, event_id: int) -> None:
        """End a subscription: once this returns, its callback is not called again."""
        await self._callbacks.unsubscribe(event_id)

    async def _check_publishers(self, scope: Scope, topic: str) -> None:
        try:
            if self.config.broker_mode:
                found = bool((await self.broker_directory()).brokers)
            else:
                found = bool(await (await self.discovery()).list(scope.channel_prefix(topic)))
        except DiscoveryError as exc:
            raise SubscriptionError(f"cannot subscribe to {scope}/{topic}: {exc}") from exc
        if not found:
            what = "broker is known" if self.config.broker_mode else "publisher is registered"
            raise SubscriptionError(
                f"no {what} for {scope}/{topic}; subscribe with stateless=True to wait for one"
            )

    def _adopt(self, member: EventPublisher | EventSubscriber) -> None:
        self._members.append(member)
        if self.config.heartbeat_period and self._heartbeats is None:
            self._heartbeats = asyncio.create_task(self._send_heartbeats(), name="meshplane-heartbeats")

    async def _send_heartbeats(self) -> None:
        """One timer for every publisher of the plane (thousands of publishers, one task)."""
        while True:
            await asyncio.sleep(self.config.heartbeat_period)
            for member in list(self._members):
                if isinstance(member, EventPublisher):
                    try:
                        await member.send_heartbeat()
                    except Exception as exc:  # a broken transport must not stop the others' heartbeats
                        log.warning("heartbeat of %r failed: %s", member, exc)

    def _forget(self, member: EventPublisher | EventSubscriber) -> None:
        with contextlib.suppress(ValueError):
            self._members.remove(member)

    async def close(self) -> None:
        """Close every publisher and subscriber of this plane, then its connections."""
        if self._closed:
            return
        await self._callbacks.close()
        for member in list(reversed(self._members)):
            try:
                await member.close()
            except Exception as exc:
                log.warning("closing %r failed: %s", member, exc)
        self._closed = True
        if self._metrics is not None:
            self._metrics.close()
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
        if self._brokers is not None:
            await self._brokers.close()
        if self._discovery is not None:
            await self._discovery.close()
        if self._nats is not None:
            with contextlib.suppress(Exception):
                await self._nats.drain()
            with contextlib.suppress(Exception):
                await self._nats.close()
        if self._mesh is not None:
            with contextlib.suppress(Exception):
                await self._mesh.flush(1.0)
            await self._mesh.close()
        if self._zap is not None:
            self._zap.stop()
        if self._zmq is not None:
            self._zmq.destroy(linger=1000)  # members closed their sockets; this catches strays


PlaneMember.plane_factory = EventPlane  # `EventPublisher.create(...)` without a plane makes one
