"""Transports: NATS core, ZeroMQ (direct and through brokers), the mesh (through a local mesh node)
and in-process memory, each a publisher
and a subscriber class with the same shape; :func:`create_publisher_transport` and
:func:`create_subscriber_transport` pick and start the one a configuration asks for (as
``create_discovery`` does for discovery)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import zmq

from meshplane.config import PlaneConfig
from meshplane.core.names import Scope, validate_name
from meshplane.transports.base import PublisherTransport, SubscriberTransport
from meshplane.transports.curve import Curve

if TYPE_CHECKING:
    from meshplane.transports.zmq_broker import BrokerDirectory


class Resources(Protocol):
    """What transports share in a process (an :class:`~meshplane.plane.EventPlane` provides them)."""

    config: PlaneConfig

    @property
    def curve(self) -> Curve | None: ...

    def zmq_context(self) -> zmq.Context[zmq.Socket[bytes]]: ...

    async def nats(self) -> Any: ...

    async def mesh(self) -> Any: ...

    async def broker_directory(self) -> BrokerDirectory: ...


async def create_publisher_transport(
    shared: Resources, scope: Scope, topic: str, publisher_id: int, identity: int | None = None
) -> PublisherTransport:
    """``identity``: the publisher's stable identity, on which broker mode picks its brokers
    (``publisher_id`` when None)."""
    validate_name("topic", topic)
    cfg = shared.config
    transport: PublisherTransport
    if cfg.broker_mode:
        from meshplane.transports.zmq_broker import ZmqBrokerPublisherTransport

        transport = ZmqBrokerPublisherTransport(
            shared.zmq_context(),
            await shared.broker_directory(),
            scope.subject(topic).encode(),
            publisher_id,
            cfg.send_hwm,
            cfg.wire_format,
            cfg.codec,
            cfg.broker_fanout,
            shared.curve,
            wait_when_full=cfg.send_when_full == "wait",
            envelope_topic=topic,
            identity=publisher_id if identity is None else identity,
        )
    elif cfg.event_plane == "mem":
        from meshplane.transports.memory import MemoryPublisherTransport

        transport = MemoryPublisherTransport(scope.subject(topic), cfg.wire_format, cfg.codec)
    elif cfg.event_plane == "mesh":
        from meshplane.transports.mesh import MeshPublisherTransport

        transport = MeshPublisherTransport(
            await shared.mesh(),
            scope.subject(topic),
            scope.subject_prefix,
            cfg.wire_format,
            cfg.codec,
            guaranteed=cfg.mesh_guaranteed,
        )
    elif cfg.event_plane == "nats":
        from meshplane.transports.nats import NatsPublisherTransport

        transport = NatsPublisherTransport(
            await shared.nats(), scope.subject(topic), scope.subject_prefix, cfg.wire_format, cfg.codec
        )
    else:
        from meshplane.transports.zmq import ZmqPublisherTransport

        transport = ZmqPublisherTransport(
            shared.zmq_context(),
            topic.encode(),
            publisher_id,
            cfg.host,
            cfg.send_hwm,
            cfg.wire_format,
            cfg.codec,
            shared.curve,
            wait_when_full=cfg.send_when_full == "wait",
            envelope_topic=topic,
        )
    await transport.start()
    return transport


async def create_subscriber_transport(shared: Resources, scope: Scope, topic: str) -> SubscriberTransport:
    validate_name("topic", topic)
    cfg = shared.config
    transport: SubscriberTransport
    if cfg.broker_mode:
        from meshplane.transports.zmq_broker import ZmqBrokerSubscriberTransport

        transport = ZmqBrokerSubscriberTransport(
            shared.zmq_context(),
            await shared.broker_directory(),
            scope.subject(topic).encode(),
            cfg.receive_hwm,
            cfg.max_message_bytes,
            cfg.dedup_capacity,
            shared.curve,
            busy_poll=cfg.busy_poll,
        )
    elif cfg.event_plane == "mem":
        from meshplane.transports.memory import MemorySubscriberTransport

        transport = MemorySubscriberTransport(
            scope.subject(topic), cfg.max_message_bytes, cfg.receive_hwm or 2**31
        )
    elif cfg.event_plane == "mesh":
        from meshplane.transports.mesh import MeshSubscriberTransport

        transport = MeshSubscriberTransport(
            await shared.mesh(),
            scope.subject(topic),
            cfg.max_message_bytes,
            cfg.receive_hwm or 2**31,
            envelope_topic=topic,
        )
    elif cfg.event_plane == "nats":
        from meshplane.transports.nats import NatsSubscriberTransport

        transport = NatsSubscriberTransport(
            await shared.nats(),
            scope.subject(topic),
            cfg.max_message_bytes,
            cfg.receive_hwm or 2**31,
            envelope_topic=topic,
        )
    else:
        from meshplane.transports.zmq import ZmqSubscriberTransport

        transport = ZmqSubscriberTransport(
            shared.zmq_context(),
            topic.encode(),
            cfg.receive_hwm,
            cfg.max_message_bytes,
            shared.curve,
            envelope_topic=topic,
            busy_poll=cfg.busy_poll,
        )
    await transport.start()
    return transport
