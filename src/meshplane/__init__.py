"""meshplane: a Python event plane and event mesh.

>>> from meshplane import EventPublisher, EventSubscriber, Scope
"""

from meshplane.config import PlaneConfig
from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import WireFormat
from meshplane.core.names import Scope
from meshplane.errors import (
    ClosedError,
    ConfigError,
    DiscoveryError,
    InvalidDiscoveryRecord,
    InvalidName,
    MeshplaneError,
    PayloadTooLarge,
    TransportError,
    WireError,
)
from meshplane.plane import EventPlane
from meshplane.publisher import EventPublisher
from meshplane.subscriber import EventSubscriber, SubscriberStats

__version__ = "0.1.0"

__all__ = [
    "ClosedError",
    "Codec",
    "ConfigError",
    "DiscoveryError",
    "EventEnvelope",
    "EventPlane",
    "EventPublisher",
    "EventSubscriber",
    "InvalidDiscoveryRecord",
    "InvalidName",
    "MeshplaneError",
    "PayloadTooLarge",
    "PlaneConfig",
    "Scope",
    "SubscriberStats",
    "TransportError",
    "WireError",
    "WireFormat",
]
