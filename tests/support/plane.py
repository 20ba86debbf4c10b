"""The event plane's tests: when a publisher may publish without loss, and which modes register it."""

from __future__ import annotations

from meshplane import EventPublisher, PlaneConfig


async def ready(pub: EventPublisher, subscribers: int = 1) -> None:
    """ZeroMQ drops what is sent before a subscriber's subscription arrives; wait for it.

    In broker mode each broker forwards the subscription: one is enough for nothing to be lost.
    """
    if pub.config.event_plane == "zmq":
        await pub.wait_for_subscribers(subscribers, timeout=10)


def registers_publishers(config: PlaneConfig) -> bool:
    """Broker mode, as in Dynamo, registers brokers in discovery but not publishers."""
    return not config.broker_mode
