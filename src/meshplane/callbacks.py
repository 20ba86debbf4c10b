"""Tango-style subscriptions: a callback per event id, fed by a subscriber (seed 001).

:class:`CallbackSubscriptions` is what ``EventPlane.subscribe_event`` / ``unsubscribe_event`` use; it
needs only a way to open a subscriber and to ask whether anyone publishes.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from meshplane.aio import cancel_and_wait
from meshplane.core.names import Scope, validate_name
from meshplane.errors import DiscoveryError, SubscriptionError, TransportError
from meshplane.subscriber import EventSubscriber, Notice

log = logging.getLogger(__name__)

EventCallback = Callable[[Any], "Awaitable[None] | None"]
OpenSubscriber = Callable[[Scope, str], Awaitable[EventSubscriber]]
#: Whether a subscriber of (scope, topic) has anyone to hear from now; raises what it sees as a
#: message for the user when not (``SubscriptionError``).
CheckPublishers = Callable[[Scope, str], Awaitable[None]]


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


class CallbackSubscriptions:
    """The callback subscriptions of one plane, by event id."""

    def __init__(
        self, open_subscriber: OpenSubscriber, check_publishers: CheckPublishers, retry_every: float
    ) -> None:
        self._open_subscriber = open_subscriber
        self._check_publishers = check_publishers
        self._retry_every = retry_every
        self._subscriptions: dict[int, _Subscription] = {}
        self._event_ids = itertools.count(1)

    async def subscribe(self, scope: Scope, topic: str, callback: EventCallback, *, stateless: bool) -> int:
        validate_name("topic", topic)
        event_id = next(self._event_ids)
        subscription = _Subscription(event_id, scope, topic, callback)
        if stateless:
            subscription.tasks.append(asyncio.create_task(self._connect_later(subscription)))
        else:
            self._start_pumps(subscription, await self._subscriber_with_publishers(scope, topic))
        self._subscriptions[event_id] = subscription
        return event_id

    async def unsubscribe(self, event_id: int) -> None:
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

    async def close(self) -> None:
        for event_id in list(self._subscriptions):
            await self.unsubscribe(event_id)

    async def _subscriber_with_publishers(self, scope: Scope, topic: str) -> EventSubscriber:
        try:
            subscriber = await self._open_subscriber(scope, topic)
        except (DiscoveryError, TransportError) as exc:
            raise SubscriptionError(f"cannot subscribe to {scope}/{topic}: {exc}") from exc
        try:
            await self._check_publishers(scope, topic)
        except BaseException:
            await subscriber.close()
            raise
        return subscriber

    async def _connect_later(self, subscription: _Subscription) -> None:
        while True:
            try:
                subscriber = await self._open_subscriber(subscription.scope, subscription.topic)
            except (DiscoveryError, TransportError) as exc:
                await subscription.deliver(exc)
                await asyncio.sleep(self._retry_every)
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
