"""Errors of the streams API; each carries the HTTP status that describes it."""

from __future__ import annotations

from typing import Any

from meshplane.errors import MeshplaneError


class StreamError(MeshplaneError):
    status = 400
    kind = "BadRequest"

    def details(self) -> dict[str, Any]:
        return {}


class BadRequest(StreamError):
    pass


class NotFound(StreamError):
    status = 404
    kind = "NotFound"


class Conflict(StreamError):
    status = 409
    kind = "Conflict"


class LimitReached(StreamError):
    status = 429
    kind = "LimitReached"


class PayloadTooLarge(StreamError):
    status = 413
    kind = "PayloadTooLarge"


class OffsetOutOfRange(StreamError):
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


_BY_STATUS: dict[int, type[StreamError]] = {
    400: BadRequest,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: LimitReached,
}


def error_from_response(status: int, body: Any) -> StreamError:
    """The error a client raises for an error answer of the server (``{"error", "code", "type", ...}``)."""
    if isinstance(body, dict) and body.get("type") == "OffsetOutOfRange":
        return OffsetOutOfRange(int(body["requested"]), int(body["oldest"]), body.get("newest"))
    message = body.get("error") if isinstance(body, dict) else str(body)
    return _BY_STATUS.get(status, StreamError)(f"{status}: {message}")
