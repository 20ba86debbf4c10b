"""The streams service's errors: one family under :class:`meshplane.errors.StreamError`, each with a
``kind`` and no transport in it; :data:`HTTP_STATUS` is the one table from kinds to HTTP statuses."""

from __future__ import annotations

import errno
from typing import Any

import meshplane.core.groups  # noqa: F401 - the group kinds, so that answers map back to them
from meshplane import errors
from meshplane.errors import BadRequest, Conflict, NotFound, OffsetOutOfRange, StreamError


class Forbidden(StreamError):
    kind = "Forbidden"


class Unauthorized(StreamError, errors.AuthError):
    """The server wants a token and got none, or a wrong one."""

    kind = "Unauthorized"


class RequestTimeout(StreamError):
    kind = "RequestTimeout"


class LimitReached(StreamError):
    """A bound refused the request (429); ``limit`` names which, as its refusals are counted by."""

    kind = "LimitReached"

    def __init__(self, message: str, limit: str = "other") -> None:
        super().__init__(message)
        self.limit = limit

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit}


class PayloadTooLarge(StreamError, errors.PayloadTooLarge):
    """An event, or a request, over the server's limit (the event plane's error, in this family)."""

    kind = "PayloadTooLarge"


class StorageError(StreamError):
    """A write, fsync or rename failed; what the request asked for was not stored (and left no trace)."""

    kind = "StorageUnavailable"


class StorageFull(StorageError):
    kind = "InsufficientStorage"


def storage_error(exc: OSError, what: str) -> StorageError:
    """The error a client sees for a failed file operation: 507 for a full disk or quota, else 503."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    kind = StorageFull if full else StorageError
    return kind(f"{what} failed, nothing was stored: {exc.strerror or exc}")


class NotStored(StreamError):
    """A guaranteed publish the mesh did not store (a destination's spool is full, a write failed):
    the publisher may retry it."""

    kind = "NotStored"


class OutcomeUnknown(StreamError):
    """A guaranteed publish that was written but may not be where it must be (an HA mate lost its
    lease before its standby confirmed it, a failed fsync): it may or may not be stored. A client that
    chose the event id (the mesh protocol's clients) sends it again with the same id."""

    kind = "OutcomeUnknown"


class CorruptRecords(StreamError):
    """Offsets whose records failed their checks on disk (a flipped bit, a bad sector): skippable,
    reading goes on at ``next_offset``. Like Kafka's CORRUPT_MESSAGE, a reader that must not lose
    data stops here; one that may, skips."""

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


# What each kind is over HTTP: the one place statuses are decided (the server answers with them,
# clients map answers back by kind, or by status when a body has none).
HTTP_STATUS: dict[str, int] = {
    "BadRequest": 400,
    "OffsetOutOfRange": 400,
    "GroupError": 400,
    "Unauthorized": 401,
    "Forbidden": 403,
    "NotFound": 404,
    "UnknownMember": 404,
    "RequestTimeout": 408,
    "Conflict": 409,
    "IllegalGeneration": 409,
    "NotPartitionOwner": 409,
    "GroupNotEmpty": 409,
    "CorruptRecords": 410,
    "PayloadTooLarge": 413,
    "LimitReached": 429,
    "StorageUnavailable": 503,
    "NotStored": 503,
    "OutcomeUnknown": 503,
    "InsufficientStorage": 507,
}


def http_status(exc: StreamError) -> int:
    return HTTP_STATUS.get(exc.kind, 400)


def _kinds(base: type[StreamError]) -> dict[str, type[StreamError]]:
    found = {base.kind: base}
    for sub in base.__subclasses__():
        found.update(_kinds(sub))
    return found


UNAUTHORIZED = (
    "401 Unauthorized: the streams server wants a token (the token option, --token-file or "
    "MESHPLANE_STREAMS_TOKEN), or refused the one given"
)


def not_a_streams_server(url: str, status: int) -> str:
    return f"{url} answered {status} with a body that is not JSON: is it a meshplane streams server?"


def not_http(url: str, parser_message: str) -> str:
    """What a URL that answers but not in HTTP is (the NATS port, most often: it greets with INFO)."""
    if "INFO {" in parser_message:
        return f"{url} is a NATS server, not a meshplane streams server (whose URL is like http://127.0.0.1:15500)"
    return f"{url} does not answer in HTTP: is it a meshplane streams server?"


def error_from_response(status: int, body: Any) -> StreamError:
    """The error a client raises for an error answer of the server (``{"error", "code", "type", ...}``)."""
    kind = body.get("type") if isinstance(body, dict) else None
    if kind == "CorruptRecords":
        return CorruptRecords(int(body["requested"]), int(body["corrupt_from"]), int(body["next_offset"]))
    if kind == "OffsetOutOfRange":
        return OffsetOutOfRange(int(body["requested"]), int(body["oldest"]), body.get("newest"))
    message = body.get("error") if isinstance(body, dict) else str(body)
    by_kind = _kinds(StreamError)
    cls = by_kind.get(kind) if isinstance(kind, str) else None
    if cls is None:
        cls = next((by_kind.get(k) for k, code in HTTP_STATUS.items() if code == status), None) or StreamError
    if cls in (CorruptRecords, OffsetOutOfRange):  # without their details: the plain family error
        cls = StreamError
    return cls(f"{status}: {message}")


__all__ = [
    "HTTP_STATUS",
    "UNAUTHORIZED",
    "BadRequest",
    "Conflict",
    "CorruptRecords",
    "Forbidden",
    "LimitReached",
    "NotFound",
    "OffsetOutOfRange",
    "PayloadTooLarge",
    "RequestTimeout",
    "StorageError",
    "StorageFull",
    "StreamError",
    "Unauthorized",
    "error_from_response",
    "http_status",
    "not_a_streams_server",
    "storage_error",
]
