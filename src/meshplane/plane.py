"""``EventPlane``: owns the configuration and the connections publishers and subscribers share."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from meshplane.aio import cancel_and_wait
from meshplane.config import PlaneConfig
from meshplane.core.names import Scope, validate_name
from meshplane.discovery import Discovery, create_discovery
from meshplane.errors import ClosedError, DiscoveryError, SubscriptionError, TransportError
from meshplane.publisher import EventPublisher
from meshplane.subscriber import EventSubscriber, Notice
from meshplane.transports import create_publisher_transport, create_subscriber_transport
from meshplane.transports.base import PublisherTransport, SubscriberTransport
from meshplane.transports.curve import Curve
from meshplane.transports.zmq_broker import BrokerDirectory

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

log = logging.getLogger(__name__)
_MAX_ZMQ_SOCKETS = 65_536


EventCallback = Callable[[Any], "Awaitable[None] | None"]


class _Subscription:
    """One ``subscribe_event``: its callback, the tasks feeding it, and the lock that serialises calls."""

    def __init__(self, event_id: int, scope: Scope, topic: str, callback: EventCallback) -> None:
        self.event_id = event_id
        self.scope = scope
        self.topic = topic
        self.callback = callback
        self.subscriber: EventSubscriber | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.lock = asyncio.Lock()
        self.active = True

    async def deliver(self, item: Any) -> None:
        async with self.lock:
            if not self.active:
                return
            try:
                result = self.callback(item)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception(
                    "callback of subscription %d (%s/%s) failed", self.event_id, self.scope, self.topic
                )


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
        self._zmq: zmq.Context[zmq.Socket[bytes]] | None = None
        self._zap: ThreadAuthenticator | None = None
        self._brokers: BrokerDirectory | None = None
        self._lock = asyncio.Lock()
        self._members: list[EventPublisher | EventSubscriber] = []
        self._heartbeats: asyncio.Task[None] | None = None
        self._subscriptions: dict[int, _Subscription] = {}
        self._event_ids = itertools.count(1)
        self._closed = False

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

    async def publisher(self, scope: Scope, topic: str) -> EventPublisher:
        return await EventPublisher.create(scope, topic, plane=self)

    async def subscriber(self, scope: Scope, topic: str) -> EventSubscriber:
        return await EventSubscriber.create(scope, topic, plane=self)

    async def subscribe_event(
        self, scope: Scope, topic: str, callback: EventCallback, *, stateless: bool = False
    ) -> int:
        """Tango-style subscription: ``callback`` gets every event, notice and error; returns an event id.

        ``callback(item)`` may be a plain function or a coroutine function; ``item`` is an
        :class:`EventEnvelope`, a notice (:class:`EventTimeout`, :class:`PublisherRecovered`,
        :class:`EventGap`) or a :class:`MeshplaneError`. Calls never overlap, may subscribe or
        unsubscribe themselves, and stop before :meth:`unsubscribe_event` returns.

        ``stateless=False`` fails at once (:class:`SubscriptionError`) when discovery is unreachable or
        no publisher is registered; ``stateless=True`` always succeeds and connects when it can,
        reporting each failed attempt to the callback.
        """
        self._check_open()
        validate_name("topic", topic)
        event_id = next(self._event_ids)
        subscription = _Subscription(event_id, scope, topic, callback)
        if stateless:
            subscription.tasks.append(asyncio.create_task(self._connect_later(subscription)))
        else:
            subscriber = await self._subscriber_with_publishers(scope, topic)
            self._start_pumps(subscription, subscriber)
        self._subscriptions[event_id] = subscription
        return event_id

    async def unsubscribe_event(self, event_id: int) -> None:
        """End a subscription: once this returns, its callback is not called again."""
        subscription = self._subscriptions.pop(event_id, None)
        if subscription is None:
            raise SubscriptionError(f"no subscription with event id {event_id}")
        current = asyncio.current_task()
        if current in subscription.tasks:  # called from its own callback: the lock is ours already
            subscription.active = False
        else:
            async with subscription.lock:  # let a running callback finish
                subscription.active = False
        for task in subscription.tasks:
            if task is not current:
                await cancel_and_wait(task)
        if subscription.subscriber is not None:
            await subscription.subscriber.close()

    async def _subscriber_with_publishers(self, scope: Scope, topic: str) -> EventSubscriber:
        try:
            subscriber = await EventSubscriber.create(scope, topic, plane=self)
        except (DiscoveryError, TransportError) as exc:
            raise SubscriptionError(f"cannot subscribe to {scope}/{topic}: {exc}") from exc
        if self.config.broker_mode:
            found = bool((await self.broker_directory()).brokers)
        else:
            found = bool(await (await self.discovery()).list(scope.channel_prefix(topic)))
        if not found:
            await subscriber.close()
            what = "broker is known" if self.config.broker_mode else "publisher is registered"
            raise SubscriptionError(
                f"no {what} for {scope}/{topic}; subscribe with stateless=True to wait for one"
            )
        return subscriber

    async def _connect_later(self, subscription: _Subscription) -> None:
        delay = self.config.heartbeat_period or 1.0
        while True:
            try:
                subscriber = await EventSubscriber.create(subscription.scope, subscription.topic, plane=self)
            except (DiscoveryError, TransportError) as exc:
                await subscription.deliver(exc)
                await asyncio.sleep(delay)
                continue
            self._start_pumps(subscription, subscriber)
            return

    def _start_pumps(self, subscription: _Subscription, subscriber: EventSubscriber) -> None:
        subscription.subscriber = subscriber
        notices: asyncio.Queue[Notice] = asyncio.Queue()
        subscriber.on_notice(notices.put_nowait)

        async def pump_events() -> None:
            async for envelope in subscriber:
                await subscription.deliver(envelope)
                if not subscription.active:
                    return

        async def pump_notices() -> None:
            while subscription.active:
                await subscription.deliver(await notices.get())

        subscription.tasks += [asyncio.create_task(pump_events()), asyncio.create_task(pump_notices())]

    async def publisher_transport(self, scope: Scope, topic: str, publisher_id: int) -> PublisherTransport:
        return await create_publisher_transport(self, scope, topic, publisher_id)

    async def subscriber_transport(self, scope: Scope, topic: str) -> SubscriberTransport:
        return await create_subscriber_transport(self, scope, topic)

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

    def _release(self, member: EventPublisher | EventSubscriber) -> None:
        with contextlib.suppress(ValueError):
            self._members.remove(member)

    async def close(self) -> None:
        """Close every publisher and subscriber of this plane, then its connections."""
        if self._closed:
            return
        for event_id in list(self._subscriptions):
            await self.unsubscribe_event(event_id)
        for member in list(reversed(self._members)):
            try:
                await member.close()
            except Exception as exc:
                log.warning("closing %r failed: %s", member, exc)
        self._closed = True
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
        if self._zap is not None:
            self._zap.stop()
        if self._zmq is not None:
            self._zmq.destroy(linger=1000)  # members closed their sockets; this catches strays
