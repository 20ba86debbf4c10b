"""One exception hierarchy for meshplane, rooted at :class:`MeshplaneError`."""

from __future__ import annotations

from typing import Any


class MeshplaneError(Exception):
    """Base class of every error meshplane raises on purpose."""


class StreamError(MeshplaneError):
    """An operation of the streams service that cannot be done. ``kind`` names what went wrong; an
    adapter maps it to its own terms (HTTP statuses: ``meshplane.streams.errors.HTTP_STATUS``)."""

    kind = "BadRequest"

    def details(self) -> dict[str, Any]:
        """What a client needs beyond the message (offsets, bounds), as JSON-ready values."""
        return {}


class BadRequest(StreamError):
    """The request itself is wrong (a missing field, a bad value)."""


class NotFound(StreamError):
    kind = "NotFound"


class Conflict(StreamError):
    """The request clashes with the current state (exists already, stale generation, not the owner)."""

    kind = "Conflict"


class OffsetOutOfRange(StreamError, ValueError):
    """An offset below the oldest retained one (or beyond the next one)."""

    kind = "OffsetOutOfRange"

    def __init__(self, requested: int, oldest: int, newest: int | None) -> None:
        self.requested, self.oldest, self.newest = requested, oldest, newest
        newest_text = "none (empty)" if newest is None else str(newest)
        super().__init__(
            f"OffsetOutOfRange: offset {requested} is not available "
            f"(oldest retained {oldest}, newest {newest_text})"
        )

    def details(self) -> dict[str, Any]:
        return {"requested": self.requested, "oldest": self.oldest, "newest": self.newest}


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


class AuthError(MeshplaneError):
    """A server refused the credentials, or wanted some and got none."""


class TransportAuthError(TransportError, AuthError):
    """A server of the event plane (NATS) refused the credentials."""


class LoginBusy(TransportAuthError):
    """The node refused the LOGIN unchecked, its bounded queue of password checks full: the client
    tries again, with backoff, until its timeout (a fleet connecting at once all gets in)."""


class WrongCredentials(TransportAuthError):
    """The node checked the LOGIN and refused its user or password: reconnecting stops (each try
    would cost the node a password check, for the same answer)."""


class PermissionDenied(MeshplaneError):
    """A mesh client's publish or subscription that its Message VPN's permissions or limits refuse
    (the message says which, in one line)."""


class SubscriptionError(MeshplaneError):
    """A (non-stateless) subscription cannot be made now: nothing publishes, or discovery is unreachable."""


class ClosedError(MeshplaneError):
    """The publisher, subscriber or plane was already closed."""
