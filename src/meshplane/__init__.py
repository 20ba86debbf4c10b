"""meshplane: a Python event plane and event mesh.

>>> from meshplane import EventPublisher, EventSubscriber, Scope
"""

import importlib
from typing import TYPE_CHECKING, Any

from meshplane.version import __version__ as __version__

if TYPE_CHECKING:
    from meshplane.config import PlaneConfig
    from meshplane.core.envelope import Codec, EventEnvelope
    from meshplane.core.framing import WireFormat
    from meshplane.core.heads import JoinedLate, PublisherLeft
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
        PermissionDenied,
        SubscriptionError,
        TransportError,
        WireError,
    )
    from meshplane.plane import EventPlane
    from meshplane.publisher import EventPublisher
    from meshplane.subscriber import EventSubscriber, Notice, SubscriberStats

# Imported when first used: a process that needs one part (a Spark worker, the CLI) does not pay
# for the transports' imports.
_EXPORTS = {
    "AuthError": "meshplane.errors",
    "ClosedError": "meshplane.errors",
    "Codec": "meshplane.core.envelope",
    "ConfigError": "meshplane.errors",
    "DiscoveryError": "meshplane.errors",
    "EventEnvelope": "meshplane.core.envelope",
    "EventGap": "meshplane.core.sequence",
    "EventPlane": "meshplane.plane",
    "EventPublisher": "meshplane.publisher",
    "EventSubscriber": "meshplane.subscriber",
    "EventTimeout": "meshplane.core.liveness",
    "InvalidDiscoveryRecord": "meshplane.errors",
    "InvalidName": "meshplane.errors",
    "JoinedLate": "meshplane.core.heads",
    "MeshplaneError": "meshplane.errors",
    "Notice": "meshplane.subscriber",
    "PayloadTooLarge": "meshplane.errors",
    "PermissionDenied": "meshplane.errors",
    "PlaneConfig": "meshplane.config",
    "PublisherLeft": "meshplane.core.heads",
    "PublisherRecovered": "meshplane.core.liveness",
    "Scope": "meshplane.core.names",
    "SubscriberStats": "meshplane.subscriber",
    "SubscriptionError": "meshplane.errors",
    "TransportError": "meshplane.errors",
    "WireError": "meshplane.errors",
    "WireFormat": "meshplane.core.framing",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meshplane' has no attribute {name!r}")
    if name in ("EventPublisher", "EventSubscriber"):
        importlib.import_module("meshplane.plane")  # their create() without a plane makes an EventPlane
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
    "JoinedLate",
    "MeshplaneError",
    "Notice",
    "PayloadTooLarge",
    "PermissionDenied",
    "PlaneConfig",
    "PublisherLeft",
    "PublisherRecovered",
    "Scope",
    "SubscriberStats",
    "SubscriptionError",
    "TransportError",
    "WireError",
    "WireFormat",
]
