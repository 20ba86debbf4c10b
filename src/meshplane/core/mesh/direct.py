"""The node's direct path for a batch of frames, sans I/O: plain EVENTs (flags 0) copied as they came
to the write buffers their subject's route names, runs counted, nothing made per event.

``route_events`` here is the reference; ``_frames.c`` has the same function in C, which the node uses
(a hypothesis test compares the two on any stream, route table and dedup state). Both stop, returning
the frame's offset, at the first frame that is anything else: not whole, damaged or over the limits
(``FrameReader`` says why), another type or flags, a subject not in ``table``, a source that is not
``origin`` (16 raw bytes; None: any source ``text`` has decoded before), or one that would take a
write buffer past ``limit``. The Python path then handles that frame as it would anyway.

``table``: raw subject -> (info, ids, buffers). ``buffers``: the bytearrays each such event is appended
to, or (bytearray, ``b"MSG subject sid "``) for a NATS client, which gets the event's body as a MSG
(``MSG subject sid size CR LF body CR LF``).
``ids``: None, or the topic's dedup ids as ``DedupCache`` keeps them (ids (timestamp, sequence,
source, peer); the C function takes only the C ``DedupIds``): an id already there is a duplicate (made
the newest, not delivered), a new one is remembered at ``now``, the oldest dropped past the ids' bound.
``runs`` gets (info, events, duplicates) for each run of consecutive events of one entry.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

from meshplane.core.compiled import compiled
from meshplane.core.mesh.dedup import Ids
from meshplane.core.mesh.frames import HEAD_BYTES, STAMP_BYTES, FrameType

_LENGTHS = struct.Struct(">QI")  # sequence, payload length
_BE32 = struct.Struct(">I")
_BE64 = struct.Struct(">Q")
_EVENT = int(FrameType.EVENT)

Target = bytearray | tuple[bytearray, bytes]  # a frame's buffer, or a NATS client's and its MSG prefix
Entry = tuple[Any, Ids | None, tuple[Target, ...]]
#: route_events(buffer, start, max_payload, max_subject, origin, text, table, limit, peer, now, runs)
RouteEvents = Callable[
    [
        bytes,
        int,
        int,
        int,
        "bytes | None",
        dict[bytes, str],
        dict[bytes, Entry],
        int,
        "str | None",
        float,
        list[tuple[Any, int, int]],
    ],
    int,
]


def route_events(
    buffer: bytes,
    start: int,
    max_payload: int,
    max_subject: int,
    origin: bytes | None,
    text: dict[bytes, str],
    table: dict[bytes, Entry],
    limit: int,
    peer: str | None,
    now: float,
    runs: list[tuple[Any, int, int]],
) -> int:
    """The reference (see the module)."""
    size = len(buffer)
    info: Any = None
    entry: Entry | None = None
    events = duplicates = 0
    while size - start >= HEAD_BYTES:
        kind, flags = buffer[start], buffer[start + 1]
        subject_length = (buffer[start + 18] << 8) | buffer[start + 19]
        if kind != _EVENT or flags or subject_length > max_subject:
            break
        middle = start + HEAD_BYTES + subject_length
        if size < middle + _LENGTHS.size:
            break
        sequence, payload_length = _LENGTHS.unpack_from(buffer, middle)
        if payload_length > max_payload or payload_length < STAMP_BYTES:
            break
        end = middle + _LENGTHS.size + payload_length
        if size < end + 4 or zlib.crc32(buffer[start:end]) != _BE32.unpack_from(buffer, end)[0]:
            break
        raw_source = buffer[start + 2 : start + 18]
        source = None
        if origin is not None:
            if raw_source != origin:
                break
        else:
            source = text.get(raw_source)
            if source is None:
                break
        found = table.get(buffer[start + HEAD_BYTES : middle])
        if found is None:
            break
        if found is not entry:
            if events:
                runs.append((info, events, duplicates))
            entry, info, events, duplicates = found, found[0], 0, 0
        whole = end + 4 - start
        ids, buffers = found[1], found[2]
        body = buffer[middle + _LENGTHS.size + STAMP_BYTES : end]
        msg_tail = b"%d\r\n" % len(body) + body + b"\r\n"
        if any(
            len(out) and len(out) + whole > limit
            if isinstance(out, bytearray)
            else len(out[0]) and len(out[0]) + len(out[1]) + len(msg_tail) > limit
            for out in buffers
        ):
            break
        frame = buffer[start : end + 4]
        start = end + 4
        events += 1
        if ids is not None and ids.seen(
            (_BE64.unpack_from(buffer, middle + _LENGTHS.size)[0], sequence, source, peer), now
        ):
            duplicates += 1
            continue
        for out in buffers:
            if isinstance(out, bytearray):
                out += frame
            else:
                out[0].extend(out[1] + msg_tail)
    if events:
        runs.append((info, events, duplicates))
    return start


_frames = compiled("meshplane.core.mesh._frames")
#: The C copy when it is built, else None (the node then takes the Python path, frame by frame).
native_route_events: RouteEvents | None = _frames.route_events if _frames is not None else None
