"""MQTT 5's Message Expiry Interval (section 3.3.2.3.3) on the mesh, sans I/O.

A PUBLISH that carries one travels as an event in the NATS door's envelope (the same a NATS HPUB makes),
with the header ``Mqtt-Expires``: its deadline in milliseconds since the epoch, by the clock of the node
it was published on (the nodes' clocks are taken to agree, as for the events' timestamps). Where it is
delivered, a message past its deadline is dropped; one before it carries the seconds it has left, as the
server must forward it. NATS subscribers see the header.
"""

from __future__ import annotations

import contextlib

import msgspec

from meshplane.core.doors.nats_protocol import HEADER_LINE, unwrap
from meshplane.core.mesh.frames import FLAG_JSON_MESSAGE, FLAG_NATS_ENVELOPE

EXPIRES = b"Mqtt-Expires"
MAX_INTERVAL = 0xFFFFFFFF  # the property is a Four Byte Integer


def expiry_headers(deadline_ms: int) -> bytes:
    """A NATS header block holding a message's deadline."""
    return b"%s\r\n%s: %d\r\n\r\n" % (HEADER_LINE, EXPIRES, deadline_ms)


def deadline_of(headers: bytes | None) -> int | None:
    """The deadline a header block holds (None: none, or not a number: the message never expires)."""
    if not headers or EXPIRES not in headers:
        return None
    for line in headers.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == EXPIRES.lower():
            text = value.strip()
            return int(text) if text.isdigit() and len(text) < 20 else None
    return None


def seconds_left(deadline_ms: int, now_ms: int) -> int:
    """Whole seconds a message has left, rounded up, at most :data:`MAX_INTERVAL` (a NATS client
    writes any deadline it likes); 0: it has expired."""
    return min(-((now_ms - deadline_ms) // 1000), MAX_INTERVAL) if now_ms < deadline_ms else 0


def payload_of(body: bytes, flags: int, queued: bool = False) -> tuple[bytes, int | None]:
    """What an MQTT client gets of an event's body, and the deadline it carries: a NATS request's or
    HPUB's payload (MQTT has room for the payload only), a pub/sub message's payload as JSON, else the
    body. A queue keeps no flags: what it held (``queued``) is an envelope if it starts like one."""
    if flags & FLAG_JSON_MESSAGE:
        with contextlib.suppress(msgspec.DecodeError, AttributeError):
            return msgspec.json.encode(msgspec.json.decode(body).get("payload")), None
        return body, None
    if not (queued or flags & FLAG_NATS_ENVELOPE):
        return body, None
    _, headers, payload = unwrap(body)
    return payload, deadline_of(headers)
