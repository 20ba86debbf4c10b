"""How the meshplane command fails: one line on stderr saying what to do, and an exit code.

Every failure a user can act on is mapped here and nowhere else; anything not mapped is a bug and
keeps its traceback.

Exit codes: 0 done; 1 nothing came (``sub --timeout``, invalid records found by ``ls``);
2 bad input (arguments, JSON, names, addresses, refused by a server); 3 a server could not be
reached or did not answer in time; 4 credentials missing or refused; 130 interrupted.
"""

from __future__ import annotations

import json
import sys

import msgspec
import zmq

from meshplane.errors import (
    AuthError,
    DiscoveryError,
    MeshplaneError,
    SubscriptionError,
    TransportError,
)
from meshplane.streams.errors import StorageError, StreamError

EXIT_NOTHING = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_AUTH = 4
EXIT_INTERRUPTED = 130


class CliError(MeshplaneError):
    """A failure the command explains itself (bad input it found before asking anyone)."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _one_line(text: str) -> str:
    return " ".join(text.split())


def explain(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for a failure the user can act on; None for a bug."""
    if isinstance(exc, CliError):
        return exc.exit_code, str(exc)
    if isinstance(exc, AuthError):
        return EXIT_AUTH, f"authentication failed: {exc}"
    if isinstance(exc, StreamError):
        unreachable = "cannot reach" in str(exc) or isinstance(exc, StorageError)
        return (EXIT_UNREACHABLE if unreachable else EXIT_BAD_INPUT), str(exc)
    if isinstance(exc, TransportError | DiscoveryError | SubscriptionError):
        return EXIT_UNREACHABLE, str(exc)
    if isinstance(exc, MeshplaneError):
        return EXIT_BAD_INPUT, str(exc)
    if isinstance(exc, json.JSONDecodeError | msgspec.DecodeError):
        return EXIT_BAD_INPUT, f"not valid JSON: {exc}"
    if isinstance(exc, zmq.ZMQError):
        return (
            EXIT_BAD_INPUT,
            f"ZeroMQ refused the address or socket: {exc.strerror} (addresses look like tcp://host:port)",
        )
    aiohttp = sys.modules.get("aiohttp")  # only when a command used it
    if aiohttp is not None and isinstance(exc, aiohttp.ClientConnectorError):
        return EXIT_UNREACHABLE, f"cannot reach {exc.host}:{exc.port} ({exc.os_error.strerror or exc})"
    if isinstance(exc, TimeoutError):
        return EXIT_UNREACHABLE, str(exc) or "timed out"
    if isinstance(exc, ConnectionError):
        return EXIT_UNREACHABLE, f"connection failed: {exc}"
    return None


def report(exc: BaseException) -> int:
    """Print ``exc`` as one line and return its exit code; re-raise what is not a user's failure."""
    explained = explain(exc)
    if explained is None:
        raise exc
    code, message = explained
    print(f"meshplane: error: {_one_line(message)}", file=sys.stderr)
    return code
