"""An application API in the manner of FastStream: decorated handlers over an :class:`EventPlane`.

    app = MeshApp()
    scope = Scope.endpoint("shop", "orders", "api")

    @app.subscriber(scope, "orders")
    @app.publisher(scope, "receipts")          # the handler's return value is published here
    async def handle(order: Order) -> Receipt:  # the payload is decoded into the first parameter's type
        return Receipt(order.id, total=order.amount)

    asyncio.run(app.run())                      # until Ctrl-C; or `async with app.running():`

``async with app.test() as test:`` runs the same handlers over the in-process transport and discovery:
handlers are unit-tested without servers (the real transports stay the default).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import typing
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from meshplane.config import PlaneConfig
from meshplane.core.envelope import EventEnvelope
from meshplane.core.names import Scope
from meshplane.errors import MeshplaneError
from meshplane.plane import EventPlane
from meshplane.publisher import EventPublisher
from meshplane.subscriber import EventSubscriber

log = logging.getLogger(__name__)

Handler = Callable[..., Any]
Hook = Callable[[], "Awaitable[None] | None"]


@dataclass
class _Route:
    handler: Handler
    sources: list[tuple[Scope, str]] = field(default_factory=list)
    outputs: list[tuple[Scope, str]] = field(default_factory=list)


def _payload_type(handler: Handler) -> Any:
    """The first parameter's annotation (``Any`` when there is none): what the payload decodes into."""
    parameters = list(inspect.signature(handler).parameters.values())
    if not parameters:
        raise MeshplaneError(f"handler {handler.__qualname__} takes no parameter for the event")
    hints = typing.get_type_hints(handler)
    return hints.get(parameters[0].name, Any)


def _decoder(kind: Any) -> Callable[[EventEnvelope], Any]:
    if kind is EventEnvelope:
        return lambda envelope: envelope
    if kind is bytes:
        return lambda envelope: envelope.payload
    return lambda envelope: envelope.decode(kind)


class MeshApp:
    """Handlers (``@app.subscriber``), their outputs (``@app.publisher``), start/stop hooks, and one plane.

    ``stats`` counts ``handled``, ``published``, ``undecodable`` (payloads that did not fit the
    handler's type: logged and dropped) and ``failed`` (handlers that raised: logged; the app goes on).
    """

    def __init__(self, config: PlaneConfig | None = None, **overrides: Any) -> None:
        self._config = config
        self._overrides = overrides
        self._routes: dict[Handler, _Route] = {}
        self._on_startup: list[Hook] = []
        self._on_shutdown: list[Hook] = []
        self.stats: Counter[str] = Counter()
        self.plane: EventPlane | None = None

    def _route(self, handler: Handler) -> _Route:
        return self._routes.setdefault(handler, _Route(handler))

    def subscriber(self, scope: Scope, topic: str) -> Callable[[Handler], Handler]:
        """Call the decorated function with each event of ``topic`` in ``scope``, decoded."""

        def register(handler: Handler) -> Handler:
            _payload_type(handler)  # a handler without a parameter fails here, not at the first event
            self._route(handler).sources.append((scope, topic))
            return handler

        return register

    def publisher(self, scope: Scope, topic: str) -> Callable[[Handler], Handler]:
        """Publish the decorated handler's return value (unless None) on ``topic`` in ``scope``."""

        def register(handler: Handler) -> Handler:
            self._route(handler).outputs.append((scope, topic))
            return handler

        return register

    def on_startup(self, hook: Hook) -> Hook:
        self._on_startup.append(hook)
        return hook

    def on_shutdown(self, hook: Hook) -> Hook:
        self._on_shutdown.append(hook)
        return hook

    @contextlib.asynccontextmanager
    async def running(self, config: PlaneConfig | None = None) -> AsyncIterator[EventPlane]:
        """Start hooks, publishers and subscribers; stop them all on the way out."""
        plane = EventPlane(config or self._config, **self._overrides)
        self.plane = plane
        tasks: list[asyncio.Task[None]] = []
        try:
            for hook in self._on_startup:
                await _call(hook)
            outputs: dict[tuple[Scope, str], EventPublisher] = {}
            for route in self._routes.values():
                for place in route.outputs:
                    if place not in outputs:
                        outputs[place] = await plane.publisher(*place)
            for route in self._routes.values():
                for scope, topic in route.sources:
                    subscriber = await plane.subscriber(scope, topic)
                    publishers = [outputs[place] for place in route.outputs]
                    tasks.append(asyncio.create_task(self._serve(route.handler, subscriber, publishers)))
            yield plane
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                for hook in self._on_shutdown:
                    await _call(hook)
            finally:
                await plane.close()
                self.plane = None

    async def run(self) -> None:
        """Serve until SIGINT or SIGTERM."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with self.running():
            await stop.wait()

    def test(self) -> contextlib.AbstractAsyncContextManager[TestPlane]:
        """The app on the in-process transport and discovery, with a client to drive it."""
        return _testing(self)

    async def _serve(
        self, handler: Handler, subscriber: EventSubscriber, outputs: list[EventPublisher]
    ) -> None:
        decode = _decoder(_payload_type(handler))
        async for envelope in subscriber:
            try:
                event = decode(envelope)
            except MeshplaneError as exc:
                self.stats["undecodable"] += 1
                log.warning("%s: dropped an event it cannot take: %s", handler.__qualname__, exc)
                continue
            try:
                result = await _call(handler, event)
            except Exception:
                self.stats["failed"] += 1
                log.exception("%s failed on %s #%d", handler.__qualname__, envelope.topic, envelope.sequence)
                continue
            self.stats["handled"] += 1
            if result is not None:
                for publisher in outputs:
                    await publisher.publish(result)
                    self.stats["published"] += 1


async def _call(function: Callable[..., Any], *args: Any) -> Any:
    result = function(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class TestPlane:
    """Drives an app under test: publish events to it, watch what it publishes."""

    __test__ = False  # not a pytest test class

    def __init__(self, app: MeshApp, plane: EventPlane) -> None:
        self.app = app
        self.plane = plane
        self._publishers: dict[tuple[Scope, str], EventPublisher] = {}

    async def publish(self, scope: Scope, topic: str, event: Any) -> None:
        place = (scope, topic)
        if place not in self._publishers:
            self._publishers[place] = await self.plane.publisher(scope, topic)
        await self._publishers[place].publish(event)

    async def subscriber(self, scope: Scope, topic: str) -> EventSubscriber:
        """Events the app publishes on ``topic``: subscribe before publishing what causes them."""
        return await self.plane.subscriber(scope, topic)


@contextlib.asynccontextmanager
async def _testing(app: MeshApp) -> AsyncIterator[TestPlane]:
    config = PlaneConfig(event_plane="mem", discovery_backend="mem")
    async with app.running(config) as plane:
        yield TestPlane(app, plane)


__all__ = ["MeshApp", "TestPlane"]
