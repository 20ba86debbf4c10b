"""The NATS client protocol (https://docs.nats.io/reference/reference-protocols/nats-protocol), sans I/O.

:class:`NatsParser` turns bytes, split anywhere, into operations; the ``encode_*`` functions make the
bytes of each. One parser reads both directions (a server's INFO, MSG, HMSG, +OK, -ERR as well as a
client's CONNECT, PUB, HPUB, SUB, UNSUB): the door refuses what a client may not send, and the tests
read what the door sends with the same parser.

Limits as nats-server's: a control line (an operation up to its CRLF) of at most ``max_control``
bytes (4 KB), a payload of at most ``max_payload``. Anything else that breaks the grammar is a
:class:`NatsProtocolError` whose ``message`` is nats-server's ``-ERR`` text; after one, the stream is
lost (the parser refuses to go on), as nats-server closes the connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshplane.core.compiled import compiled
from meshplane.core.subjects import InvalidSubject, validate
from meshplane.errors import MeshplaneError

_native = compiled("meshplane.core.doors._nats")
#: parse_pubs(buffer, start, max_payload, max_control, out) -> offset (``_nats.c``; None where not built)
native_parse_pubs: Callable[[bytes | bytearray, int, int, int, list[Any]], int] | None = (
    None if _native is None else _native.parse_pubs
)
#: route_pubs(buffer, start, max_payload, max_control, table, source, sequence, timestamp, limit, runs)
native_route_pubs: Callable[..., int] | None = None if _native is None else _native.route_pubs

MAX_CONTROL_LINE = 4096
CRLF = b"\r\n"
HEADER_LINE = b"NATS/1.0"

UNKNOWN_OP = "Unknown Protocol Operation"
CONTROL_LINE_EXCEEDED = "Maximum Control Line Exceeded"
PAYLOAD_VIOLATION = "Maximum Payload Violation"


class NatsProtocolError(MeshplaneError, ValueError):
    """Bytes that break the NATS protocol; ``message`` is what ``-ERR`` says to the peer."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(f"{message}: {detail}" if detail else message)
        self.message = message


@dataclass(slots=True)  # not frozen: a frozen dataclass costs a setattr call per field to make
class Connect:
    options: dict[str, object]


@dataclass(slots=True)
class Info:
    options: dict[str, object]


@dataclass(slots=True)
class Pub:
    """PUB, or HPUB when ``headers`` is not None (its header block, ``NATS/1.0`` line and final CRLF in)."""

    subject: str
    reply: str
    payload: bytes
    headers: bytes | None = None


@dataclass(slots=True)
class Msg:
    """MSG, or HMSG when ``headers`` is not None."""

    subject: str
    sid: str
    reply: str
    payload: bytes
    headers: bytes | None = None


@dataclass(slots=True)
class Sub:
    subject: str
    queue: str
    sid: str


@dataclass(slots=True)
class Unsub:
    sid: str
    max_msgs: int | None = None


@dataclass(slots=True)
class Ping:
    pass


@dataclass(slots=True)
class Pong:
    pass


@dataclass(slots=True)
class Ok:
    pass


@dataclass(slots=True)
class Err:
    message: str


Op = Connect | Info | Pub | Msg | Sub | Unsub | Ping | Pong | Ok | Err


def _size(text: bytes) -> int:
    if not text.isdigit() or len(text) > 12:
        raise NatsProtocolError(UNKNOWN_OP, f"not a size: {text[:20]!r}")
    return int(text)


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NatsProtocolError(UNKNOWN_OP, "an argument that is not UTF-8") from None


def _json(raw: bytes, what: str) -> dict[str, object]:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        raise NatsProtocolError(UNKNOWN_OP, f"{what}: not JSON") from None
    if not isinstance(value, dict):
        raise NatsProtocolError(UNKNOWN_OP, f"{what}: not a JSON object")
    return value


_SHAPES = {b"PUB": (2, 3), b"HPUB": (3, 4), b"MSG": (3, 4), b"HMSG": (4, 5)}  # arguments each takes


@dataclass
class _Pending:
    """A PUB/HPUB/MSG/HMSG whose payload is still to come: ``need`` bytes and the CRLF after them."""

    kind: bytes
    args: list[str]
    header_size: int | None
    need: int


@dataclass
class NatsParser:
    max_control: int = MAX_CONTROL_LINE
    max_payload: int = 1024 * 1024
    _buffer: bytearray = field(default_factory=bytearray)
    _pending: _Pending | None = None
    _at: int = 0  # where the next operation starts in _buffer, during feed()
    _failed: NatsProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held until their operation is whole (at most max_control, or a payload + 2)."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Op]:
        """The operations ``data`` completes, in order. Raises NatsProtocolError at the first broken
        one (those before it are lost with the stream: the connection is closed)."""
        ops: list[Op] = []
        self.read(data, ops.append)
        return ops

    def read(
        self, data: bytes, handle: Callable[[Op], None], fast: Callable[[bytearray, int], int] | None = None
    ) -> None:
        """Each operation ``data`` completes to ``handle`` as soon as it is read; raises NatsProtocolError
        at the first broken one.

        ``fast(buffer, offset)``, where given, takes what it can of the buffer before each operation
        (the node's direct path: plain PUBs routed in C) and returns where it stopped; the rest is
        parsed here, so the operations keep their order whichever path takes them."""
        if self._failed is not None:
            raise self._failed
        self._buffer += data
        self._at = 0
        try:
            while True:
                if fast is not None and self._pending is None:
                    self._at = fast(self._buffer, self._at)
                op = self._next()
                if op is None:
                    break
                handle(op)
        except NatsProtocolError as exc:
            self._failed = exc
            self._buffer.clear()
            raise
        del self._buffer[: self._at]  # once per read: deleting per operation moved the rest each time

    def _next(self) -> Op | None:
        buffer, at = self._buffer, self._at
        pending = self._pending
        if pending is not None:
            end = at + pending.need
            if len(buffer) < end + 2:
                return None
            if buffer[end : end + 2] != CRLF:
                raise NatsProtocolError(UNKNOWN_OP, "a payload not followed by CRLF")
            data = bytes(buffer[at:end])
            self._at = end + 2
            self._pending = None
            return _message(pending, data)
        end = buffer.find(b"\n", at, at + self.max_control + 1)
        if end < 0:
            if len(buffer) - at > self.max_control:
                raise NatsProtocolError(CONTROL_LINE_EXCEEDED, f"over {self.max_control} bytes")
            return None
        line = bytes(buffer[at:end]).rstrip(b"\r")
        self._at = end + 1
        if line.startswith(b"PUB "):  # the most operations by far: their whole payload often here
            args = line[4:].split()
            if len(args) in (2, 3) and args[-1].isdigit() and len(args[-1]) <= 12:
                size = int(args[-1])
                start = end + 1
                if size <= self.max_payload and buffer[start + size : start + size + 2] == CRLF:
                    self._at = start + size + 2
                    reply = _text(args[1]) if len(args) == 3 else ""
                    return Pub(_text(args[0]), reply, bytes(buffer[start : start + size]))
        return self._control(line)

    def _control(self, line: bytes) -> Op | None:
        verb, _, rest = line.lstrip(b" \t").partition(b" ")
        tab = verb.find(b"\t")
        if tab >= 0:
            verb, rest = verb[:tab], verb[tab + 1 :] + b" " + rest
        verb = verb.upper()
        if verb in (b"CONNECT", b"INFO"):
            options = _json(rest, verb.decode())
            return Connect(options) if verb == b"CONNECT" else Info(options)
        args = [_text(arg) for arg in rest.split()]
        if verb == b"PING" and not args:
            return Ping()
        if verb == b"PONG" and not args:
            return Pong()
        if verb == b"+OK" and not args:
            return Ok()
        if verb == b"-ERR":
            return Err(_text(rest.strip()).strip("'"))
        if verb == b"SUB" and len(args) in (2, 3):
            return Sub(args[0], args[1] if len(args) == 3 else "", args[-1])
        if verb == b"UNSUB" and len(args) in (1, 2):
            return Unsub(args[0], _size(args[1].encode()) if len(args) == 2 else None)
        if verb in _SHAPES and len(args) in _SHAPES[verb]:
            return self._payload(verb, args)
        if not verb and not args:
            raise NatsProtocolError(UNKNOWN_OP, "an empty line")
        raise NatsProtocolError(UNKNOWN_OP, f"{verb[:16]!r} with {len(args)} arguments")

    def _payload(self, verb: bytes, args: list[str]) -> Op | None:
        headers = verb in (b"HPUB", b"HMSG")
        total = _size(args[-1].encode())
        header_size = _size(args[-2].encode()) if headers else None
        if header_size is not None and (header_size > total or header_size < len(HEADER_LINE) + 4):
            raise NatsProtocolError(UNKNOWN_OP, f"a header size of {header_size} in {total} bytes")
        if total > self.max_payload:
            raise NatsProtocolError(PAYLOAD_VIOLATION, f"{total} bytes, over {self.max_payload}")
        self._pending = _Pending(verb, args[: -2 if headers else -1], header_size, total)
        return self._next()


def _message(pending: _Pending, data: bytes) -> Op:
    headers: bytes | None = None
    if pending.header_size is not None:
        headers, data = data[: pending.header_size], data[pending.header_size :]
        if not headers.startswith(HEADER_LINE) or not headers.endswith(CRLF + CRLF):
            raise NatsProtocolError(UNKNOWN_OP, "a header block not NATS/1.0 ... CRLF CRLF")
    args = pending.args
    if pending.kind in (b"PUB", b"HPUB"):
        return Pub(args[0], args[1] if len(args) == 2 else "", data, headers)
    return Msg(args[0], args[1], args[2] if len(args) == 3 else "", data, headers)


# --- encoding -------------------------------------------------------------------------------------------


def encode_info(options: dict[str, object]) -> bytes:
    return b"INFO " + json.dumps(options, separators=(",", ":")).encode() + CRLF


def encode_connect(options: dict[str, object]) -> bytes:
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + CRLF


def encode_msg(subject: str, sid: str, reply: str, payload: bytes, headers: bytes | None = None) -> bytes:
    reply_part = f" {reply}" if reply else ""
    if headers is None:
        return f"MSG {subject} {sid}{reply_part} {len(payload)}\r\n".encode() + payload + CRLF
    line = f"HMSG {subject} {sid}{reply_part} {len(headers)} {len(headers) + len(payload)}\r\n"
    return line.encode() + headers + payload + CRLF


def encode_pub(subject: str, reply: str, payload: bytes, headers: bytes | None = None) -> bytes:
    reply_part = f" {reply}" if reply else ""
    if headers is None:
        return f"PUB {subject}{reply_part} {len(payload)}\r\n".encode() + payload + CRLF
    line = f"HPUB {subject}{reply_part} {len(headers)} {len(headers) + len(payload)}\r\n"
    return line.encode() + headers + payload + CRLF


def encode_sub(subject: str, queue: str, sid: str) -> bytes:
    return f"SUB {subject} {queue + ' ' if queue else ''}{sid}\r\n".encode()


def encode_unsub(sid: str, max_msgs: int | None = None) -> bytes:
    return f"UNSUB {sid}{'' if max_msgs is None else f' {max_msgs}'}\r\n".encode()


def encode_err(message: str) -> bytes:
    return f"-ERR '{message}'\r\n".encode()


PING = b"PING\r\n"
PONG = b"PONG\r\n"
OK = b"+OK\r\n"


def status_headers(code: int, description: str = "") -> bytes:
    """A header block that is only a status (``NATS/1.0 503``: no responders)."""
    return f"NATS/1.0 {code}{' ' + description if description else ''}\r\n\r\n".encode()


# --- across the mesh ------------------------------------------------------------------------------------

# FLAG_NATS_ENVELOPE (the frames' flags, in one place) marks an EVENT whose body is an envelope (a reply
# subject or headers with it). Events without either carry the payload as it is, so mesh clients get the
# bytes a NATS client published.
_ENVELOPE_MAGIC = b"NATS\x01"


def wrap(reply: str, headers: bytes | None, payload: bytes) -> bytes:
    """``magic | reply length (2) | header length (4) | reply | headers | payload``."""
    encoded = reply.encode()
    head = len(encoded).to_bytes(2, "big") + len(headers or b"").to_bytes(4, "big")
    return _ENVELOPE_MAGIC + head + encoded + (headers or b"") + payload


# The metadata a queue stores a body with that starts like an envelope but is none: a queue keeps no
# flags, and its reader (an MQTT session) took it apart (its tail, and an expiry its publisher wrote).
NOT_WRAPPED = "not_wrapped"


def looks_wrapped(body: bytes) -> bool:
    """Whether ``body`` starts as an envelope does (where no flag says whether it is one)."""
    return body.startswith(_ENVELOPE_MAGIC)


def unwrap(body: bytes) -> tuple[str, bytes | None, bytes]:
    """(reply, headers or None, payload) of an envelope; a body that is not one is all payload."""
    start = len(_ENVELOPE_MAGIC)
    if not body.startswith(_ENVELOPE_MAGIC) or len(body) < start + 6:
        return "", None, body
    reply_size = int.from_bytes(body[start : start + 2], "big")
    header_size = int.from_bytes(body[start + 2 : start + 6], "big")
    begin = start + 6
    if begin + reply_size + header_size > len(body):
        return "", None, body
    try:
        reply = body[begin : begin + reply_size].decode()
        if reply:  # anyone on the mesh can set the flag: a reply with a space or CR LF forged MSGs
            validate(reply, wildcards=False)
    except (UnicodeDecodeError, InvalidSubject):
        return "", None, body
    headers = body[begin + reply_size : begin + reply_size + header_size]
    return reply, headers or None, body[begin + reply_size + header_size :]
