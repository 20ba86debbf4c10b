"""One exception hierarchy for meshplane, rooted at :class:`MeshplaneError`."""

from __future__ import annotations


class MeshplaneError(Exception):
    """Base class of every error meshplane raises on purpose."""


class ConfigError(MeshplaneError, ValueError):
    """A configuration value (environment variable or argument) is invalid."""


class InvalidName(MeshplaneError, ValueError):
    """A namespace, component, endpoint or topic name cannot be used on the wire."""


class PayloadTooLarge(MeshplaneError, ValueError):
    """A payload is larger than the configured ``max_message_bytes``."""


class WireError(MeshplaneError):
    """Bytes received from the network could not be decoded.

    ``reason`` is a short stable word used as a counter label: ``malformed``,
    ``truncated``, ``version``, ``oversized``, ``frame_count``.
    """

    reason = "malformed"


class MalformedFrame(WireError):
    reason = "malformed"


class TruncatedFrame(WireError):
    reason = "truncated"


class UnsupportedVersion(WireError):
    reason = "version"


class OversizedFrame(WireError):
    reason = "oversized"


class UnexpectedFrameCount(WireError):
    reason = "frame_count"


class DiscoveryError(MeshplaneError):
    """The discovery backend could not be reached or returned something unusable."""


class InvalidDiscoveryRecord(DiscoveryError, ValueError):
    """A discovery record is not a valid EventChannel record."""


class TransportError(MeshplaneError):
    """A transport (NATS, ZeroMQ) could not be reached or failed."""


class SubscriptionError(MeshplaneError):
    """A (non-stateless) subscription cannot be made now: nothing publishes, or discovery is unreachable."""


class ClosedError(MeshplaneError):
    """The publisher, subscriber or plane was already closed."""
