"""meshplane: a Python event plane and event mesh.

>>> from meshplane import EventPublisher, EventSubscriber, Scope
"""

from meshplane.config import PlaneConfig
from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import WireFormat
from meshplane.core.liveness import EventTimeout, PublisherRecovered
from meshplane.core.names import Scope
from meshplane.core.sequence import EventGap
from meshplane.errors import (
    AuthError,
    ClosedError,
    ConfigError,
    DiscoveryError,
    InvalidDiscoveryRecord,
    InvalidName,
    MeshplaneError,
    PayloadTooLarge,
    SubscriptionError,
    TransportError,
    WireError,
)
from meshplane.plane import EventPlane
from meshplane.publisher import EventPublisher
from meshplane.subscriber import EventSubscriber, Notice, SubscriberStats
from meshplane.version import __version__ as __version__

__all__ = [
    "AuthError",
    "ClosedError",
    "Codec",
    "ConfigError",
    "DiscoveryError",
    "EventEnvelope",
    "EventGap",
    "EventPlane",
    "EventPublisher",
    "EventSubscriber",
    "EventTimeout",
    "InvalidDiscoveryRecord",
    "InvalidName",
    "MeshplaneError",
    "Notice",
    "PayloadTooLarge",
    "PlaneConfig",
    "PublisherRecovered",
    "Scope",
    "SubscriberStats",
    "SubscriptionError",
    "TransportError",
    "WireError",
    "WireFormat",
]
