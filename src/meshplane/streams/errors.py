"""Errors of the streams API; each carries the HTTP status that describes it."""

from __future__ import annotations

import errno
from typing import Any

from meshplane.errors import MeshplaneError


class StreamError(MeshplaneError):
    status = 400
    kind = "BadRequest"

    def details(self) -> dict[str, Any]:
        return {}


class BadRequest(StreamError):
    pass


class Forbidden(StreamError):
    status = 403
    kind = "Forbidden"


class NotFound(StreamError):
    status = 404
    kind = "NotFound"


class Conflict(StreamError):
    status = 409
    kind = "Conflict"


class RequestTimeout(StreamError):
    status = 408
    kind = "RequestTimeout"


class LimitReached(StreamError):
    status = 429
    kind = "LimitReached"


class PayloadTooLarge(StreamError):
    status = 413
    kind = "PayloadTooLarge"


class StorageError(StreamError):
    """A write, fsync or rename failed; what the request asked for was not stored (and left no trace)."""

    status = 503
    kind = "StorageUnavailable"


class StorageFull(StorageError):
    status = 507
    kind = "InsufficientStorage"


def storage_error(exc: OSError, what: str) -> StorageError:
    """The error a client sees for a failed file operation: 507 for a full disk or quota, else 503."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    kind = StorageFull if full else StorageError
    return kind(f"{what} failed, nothing was stored: {exc.strerror or exc}")


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


class CorruptRecords(StreamError):
    """Offsets whose records failed their checks on disk (a flipped bit, a bad sector): skippable,
    reading goes on at ``next_offset``. Like Kafka's CORRUPT_MESSAGE, a reader that must not lose
    data stops here; one that may, skips."""

    status = 410
    kind = "CorruptRecords"

    def __init__(self, requested: int, first: int, next_offset: int, where: str = "") -> None:
        self.requested, self.first, self.next_offset = requested, first, next_offset
        place = f" in {where}" if where else ""
        super().__init__(
            f"CorruptRecords: offsets {first}..{next_offset - 1}{place} are unreadable on disk; "
            f"reading can go on at offset {next_offset}"
        )

    def details(self) -> dict[str, Any]:
        return {"requested": self.requested, "corrupt_from": self.first, "next_offset": self.next_offset}


_BY_STATUS: dict[int, type[StreamError]] = {
    400: BadRequest,
    403: Forbidden,
    404: NotFound,
    408: RequestTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    429: LimitReached,
    503: StorageError,
    507: StorageFull,
}


def error_from_response(status: int, body: Any) -> StreamError:
    """The error a client raises for an error answer of the server (``{"error", "code", "type", ...}``)."""
    if isinstance(body, dict) and body.get("type") == "CorruptRecords":
        return CorruptRecords(int(body["requested"]), int(body["corrupt_from"]), int(body["next_offset"]))
    if isinstance(body, dict) and body.get("type") == "OffsetOutOfRange":
        return OffsetOutOfRange(int(body["requested"]), int(body["oldest"]), body.get("newest"))
    message = body.get("error") if isinstance(body, dict) else str(body)
    return _BY_STATUS.get(status, StreamError)(f"{status}: {message}")
