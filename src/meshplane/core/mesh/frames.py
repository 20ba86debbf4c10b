"""The mesh link protocol's frames (seed 004's layout with a variable-length subject), sans I/O.

Byte for byte (docs/mesh.md)::

    0      1   type        SUB_ADD 1, SUB_REMOVE 2, EVENT 3, HEARTBEAT 4, SYNC_REQ 5, SYNC_RESP 6, HELLO 7,
                           SPOOLED 8, ACK 9, AUTH 10, MIRROR 11, MIRROR_ACK 12 (between HA mates),
                           LOGIN 13, REFUSED 14 (a VPN user's login and permission violations)
    1      1   flags       bit 0 on EVENT: the body is a pub/sub message (JSON), else opaque bytes;
                           bit 1 on a client's ping: answer once every peer has handled what came before;
                           bit 2 on EVENT: guaranteed (stored before it is acknowledged)
    2      16  source      the origin node's id, UTF-8, NUL-padded
    18     2   S           subject length (big-endian)
    20     S   subject     UTF-8: a subject, or a pattern on SUB_ADD / SUB_REMOVE
    20+S   8   sequence    origin's event number (EVENT), interest version (SUB_*, HEARTBEAT, SYNC_RESP),
                           spool offset (SPOOLED, and ACK between nodes), event number (ACK to a client)
    28+S   4   P           payload length (big-endian)
    32+S   P   payload
    32+S+P 4   checksum    CRC-32 (zlib's) of every byte before it

:class:`FrameReader` turns a byte stream into frames. A frame whose lengths are sane but whose
checksum, type or text is wrong is reported and skipped (the stream stays in step, the link stays
up); a length beyond the limits means the stream cannot be trusted any further (``fatal``).

Guaranteed events: a node stores one in a spool per destination node, then sends it as SPOOLED (its
payload the EVENT frame as it is, its sequence the spool offset); the destination stores it and
answers ACK with the offset: everything up to it is stored there. A client's guaranteed EVENT is
answered with ACK too (its sequence the event's; a payload, if any, says why it was refused).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec

from meshplane.core.compiled import compiled
from meshplane.core.subjects import MAX_SUBJECT_BYTES

T = TypeVar("T")

PROTOCOL_VERSION = 3  # 2: the secret is proven (HELLO's nonces, then AUTH); 3: then sealed records
NODE_ID_BYTES = 16
DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024
MAX_ID_BYTES = 64  # a HELLO's node or cluster name, at most (a node id: NODE_ID_BYTES)
HANDSHAKE_FRAME_BYTES = 4096  # a HELLO or an AUTH, whole, at most (nats-server's max_control_line)

_HEAD = struct.Struct(">BB16sH")  # type, flags, source, subject length
_MIDDLE = struct.Struct(">QI")  # sequence, payload length
_CRC = struct.Struct(">I")
_STAMP = struct.Struct(">Q")  # an EVENT payload starts with the origin's timestamp (ms)
HEAD_BYTES = _HEAD.size
STAMP_BYTES = _STAMP.size  # an EVENT's body follows its timestamp
_MIDDLE_BYTES = _MIDDLE.size
_CRC_BYTES = _CRC.size
OVERHEAD = _HEAD.size + _MIDDLE.size + _CRC.size

FLAG_JSON_MESSAGE = 0x01  # on EVENT
FLAG_PROPAGATED = 0x02  # on a client's ping (empty SYNC_REQ): answer once every peer has what came before
FLAG_GUARANTEED = 0x04  # on EVENT
FLAG_BATCHED_ACKS = 0x08  # on ACK to a client that asked for them (HELLO): the numbers of stored EVENTs
FLAG_NATS_ENVELOPE = 0x40  # on EVENT: the body is a NATS door's envelope (reply subject, headers)
# An ACK's reason starting so: the event may or may not be stored (written, then the node could not
# make sure it is where it must be: an HA mate that lost its lease, a failed fsync). The client sends
# it again with the same event id, which the queues drop if they have it.
ANSWER_UNKNOWN = "unknown: "
ACKS_PER_FRAME = 8192  # numbers in one batched ACK, at most


class FrameType(enum.IntEnum):
    SUB_ADD = 1
    SUB_REMOVE = 2
    EVENT = 3
    HEARTBEAT = 4
    SYNC_REQ = 5
    SYNC_RESP = 6
    HELLO = 7
    SPOOLED = 8
    ACK = 9
    AUTH = 10
    MIRROR = 11  # active -> standby mate: data directory changes (sequence: the lease epoch)
    MIRROR_ACK = 12  # standby -> active: applied up to barrier ``sequence`` (subject: the mate's token)
    LOGIN = 13  # client -> node, sealed: a VPN user's name and password; node -> client: "" or why not
    REFUSED = 14  # node -> client: a publish (``sequence``: its number) or subscription refused, and why
    INTEREST = 15  # route -> route, if its HELLO took them: many SUB_ADD / SUB_REMOVE (InterestChange list)


@dataclass(slots=True)
class Frame:
    type: FrameType
    flags: int
    source: str
    subject: str
    sequence: int
    payload: bytes
    raw: bytes = field(default=b"", compare=False, repr=False)  # the whole frame as it came


@dataclass(frozen=True, slots=True)
class FrameError:
    """A frame that was dropped: ``reason`` is a short counter label, ``fatal`` that the stream is lost."""

    reason: str
    detail: str
    fatal: bool = False


def check_node_id(node_id: str) -> str:
    """A node id: 1-16 printable ASCII characters, compared byte for byte (no case or Unicode folding)."""
    if not node_id or len(node_id) > NODE_ID_BYTES or not (node_id.isascii() and node_id.isprintable()):
        raise ValueError(f"node id {node_id[:MAX_ID_BYTES]!r}: 1-{NODE_ID_BYTES} printable ASCII characters")
    return node_id


def check_hello_ids(hello: Hello) -> None:
    """ValueError unless HELLO's node and cluster are printable ASCII of at most ``MAX_ID_BYTES``."""
    for what, text in (("node", hello.node), ("cluster", hello.cluster)):
        if len(text) > MAX_ID_BYTES or not (text.isascii() and text.isprintable()):
            raise ValueError(f"HELLO's {what}: at most {MAX_ID_BYTES} printable ASCII characters")


def encode_frame(
    kind: FrameType, source: str, subject: str = "", sequence: int = 0, payload: bytes = b"", flags: int = 0
) -> bytes:
    if _native_encode is not None:
        frame = _native_encode(kind, flags, source, subject, sequence, payload, None)
        if frame is not None:
            return frame
    return python_encode_frame(kind, source, subject, sequence, payload, flags)


def python_encode_frame(
    kind: FrameType, source: str, subject: str = "", sequence: int = 0, payload: bytes = b"", flags: int = 0
) -> bytes:
    """The reference encoder (``_frames.c`` makes the same bytes, or leaves the case to this one)."""
    subject_bytes = subject.encode()
    body = b"".join(
        (
            _HEAD.pack(kind, flags, source.encode(), len(subject_bytes)),
            subject_bytes,
            _MIDDLE.pack(sequence, len(payload)),
            payload,
        )
    )
    return body + _CRC.pack(zlib.crc32(body))


def handshake_frame_length(buffer: bytes) -> int | None:
    """The length of the frame ``buffer`` begins with, once its lengths are in (else None);
    ValueError when it would be more than ``HANDSHAKE_FRAME_BYTES``."""
    if len(buffer) < HEAD_BYTES:
        return None
    subject_length: int = _HEAD.unpack_from(buffer)[3]
    if HEAD_BYTES + subject_length + _MIDDLE_BYTES + _CRC_BYTES > HANDSHAKE_FRAME_BYTES:
        raise ValueError(f"a handshake frame of more than {HANDSHAKE_FRAME_BYTES} bytes")
    if len(buffer) < HEAD_BYTES + subject_length + _MIDDLE_BYTES:
        return None
    payload_length: int = _MIDDLE.unpack_from(buffer, HEAD_BYTES + subject_length)[1]
    length = HEAD_BYTES + subject_length + _MIDDLE_BYTES + payload_length + _CRC_BYTES
    if length > HANDSHAKE_FRAME_BYTES:
        raise ValueError(f"a handshake frame of {length} bytes (at most {HANDSHAKE_FRAME_BYTES})")
    return length


def encode_event(
    source: str, subject: str, sequence: int, timestamp_ms: int, body: bytes, flags: int = 0
) -> bytes:
    if _native_encode is not None:
        frame = _native_encode(FrameType.EVENT, flags, source, subject, sequence, body, timestamp_ms)
        if frame is not None:
            return frame
    return python_encode_frame(
        FrameType.EVENT, source, subject, sequence, _STAMP.pack(timestamp_ms) + body, flags
    )


def event_parts(frame: Frame) -> tuple[int, bytes]:
    """An EVENT's (origin timestamp in ms, body)."""
    return _STAMP.unpack_from(frame.payload)[0], frame.payload[_STAMP.size :]


def encode_batched_ack(source: str, sequences: list[int]) -> bytes:
    """One ACK for many stored EVENTs of a client (at most ACKS_PER_FRAME): their numbers, 8 bytes each."""
    payload = struct.pack(f">{len(sequences)}Q", *sequences)
    return encode_frame(
        FrameType.ACK, source, sequence=len(sequences), payload=payload, flags=FLAG_BATCHED_ACKS
    )


def batched_ack_sequences(frame: Frame) -> tuple[int, ...]:
    """The EVENT numbers a batched ACK confirms; ValueError unless the payload is exactly that."""
    count, extra = divmod(len(frame.payload), _STAMP.size)
    if extra or count != frame.sequence:
        raise ValueError(f"a batched ACK of {len(frame.payload)} bytes for {frame.sequence} events")
    return struct.unpack(f">{count}Q", frame.payload)


def event_id(frame: Frame) -> str:
    """Seed 004's ``{timestamp}-{sequence}-{node}``: unique per origin node and restart."""
    return f"{_STAMP.unpack_from(frame.payload)[0]}-{frame.sequence}-{frame.source}"


def decode_spooled(frame: Frame, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Frame:
    """The EVENT a SPOOLED frame carries; ValueError unless it is exactly one well-formed EVENT."""
    payload = frame.payload
    if _native_read is not None and type(payload) is bytes:  # the C loop alone, when all is well
        decoded: list[Frame] = []
        end = _native_read(payload, 0, max_payload, MAX_SUBJECT_BYTES, Frame, _KINDS, _SPOOLED_TEXT, decoded)
        if end == len(payload) and len(decoded) == 1 and decoded[0].type is FrameType.EVENT:
            return decoded[0]
    reader = FrameReader(max_payload, _SPOOLED_TEXT)
    out = reader.feed(frame.payload)
    inner = out[0] if len(out) == 1 and not reader.pending else None
    if not isinstance(inner, Frame) or inner.type is not FrameType.EVENT:
        raise ValueError("a SPOOLED frame must carry exactly one well-formed EVENT")
    return inner


_TYPES = {t.value: t for t in FrameType}
_SPOOLED_TEXT: dict[bytes, str] = {}  # the texts of the EVENTs SPOOLED frames carry: a reader for each
_KINDS = tuple(_TYPES.get(kind) for kind in range(max(_TYPES) + 1))  # by type number, for the C loop
_TEXT_CACHE = 4096  # node ids and subjects seen recently, decoded once

#: ``read_frames(buffer, start, max_payload, max_subject, frame_class, kinds, text, out) -> offset``
ReadFrames = Callable[
    [bytes, int, int, int, type[Frame], tuple[FrameType | None, ...], dict[bytes, str], list[Any]], int
]
#: ``encode_frame(kind, flags, source, subject, sequence, payload, timestamp) -> bytes | None``
EncodeFrame = Callable[[int, int, str, str, int, bytes, int | None], bytes | None]

# The C loop and encoder of ``_frames.c``, chosen once (a reader is made for every SPOOLED frame).
_frames = compiled("meshplane.core.mesh._frames")
_native_read: ReadFrames | None = _frames.read_frames if _frames is not None else None
_native_encode: EncodeFrame | None = _frames.encode_frame if _frames is not None else None


class FrameReader:
    """Bytes in, frames (or the reasons frames were dropped) out."""

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD, text: dict[bytes, str] | None = None) -> None:
        """``text``: a cache of decoded sources and subjects to share (else one of its own)."""
        self.max_payload = max_payload
        self._buffer = b""
        self._chunks: list[bytes] = []  # a large frame's parts, joined once it is whole
        self._chunked = 0
        self._needed = 0  # bytes the frame begun in the buffer needs in all, once its lengths are in
        self._text: dict[bytes, str] = {} if text is None else text
        self.broken = False
        self._read_frames = _native_read

    def feed(
        self, data: bytes, direct: Callable[[bytes, int], int] | None = None
    ) -> list[Frame | FrameError]:
        """``direct(buffer, start) -> offset``: takes the frames it can from the start of what is
        whole (the node's direct path) before this reader reads the rest."""
        if self.broken:
            return []
        if self._needed:  # a large frame arriving: keep its parts, join them once (not once a part)
            self._chunks.append(data)
            self._chunked += len(data)
            if len(self._buffer) + self._chunked < self._needed:
                return []
            data, self._chunks, self._chunked, self._needed = b"".join(self._chunks), [], 0, 0
        buffer = self._buffer + data if self._buffer else data
        out: list[Frame | FrameError] = []
        append = out.append
        start, size = (direct(buffer, 0) if direct is not None else 0), len(buffer)
        unpack_head, unpack_middle, unpack_crc = _HEAD.unpack_from, _MIDDLE.unpack_from, _CRC.unpack_from
        types, text, read_frames = _TYPES, self._text, self._read_frames
        while size - start >= HEAD_BYTES:  # the one hot loop of a node: kept flat on purpose
            if read_frames is not None:  # as far as nothing is unusual; this loop takes the next frame
                start = read_frames(
                    buffer, start, self.max_payload, MAX_SUBJECT_BYTES, Frame, _KINDS, text, out
                )
                if size - start < HEAD_BYTES:
                    break
            kind, flags, raw_source, subject_length = unpack_head(buffer, start)
            if subject_length > MAX_SUBJECT_BYTES:
                return self._break(out, f"subject of {subject_length} bytes (at most {MAX_SUBJECT_BYTES})")
            middle = start + HEAD_BYTES + subject_length
            if size < middle + _MIDDLE_BYTES:
                break
            sequence, payload_length = unpack_middle(buffer, middle)
            if payload_length > self.max_payload:
                return self._break(out, f"payload of {payload_length} bytes (at most {self.max_payload})")
            end = middle + _MIDDLE_BYTES + payload_length
            if size < end + _CRC_BYTES:
                self._needed = end + _CRC_BYTES - start
                break
            raw = buffer[start : end + _CRC_BYTES]
            start = end + _CRC_BYTES
            body_end = len(raw) - _CRC_BYTES
            if zlib.crc32(raw[:body_end]) != unpack_crc(raw, body_end)[0]:
                append(FrameError("checksum", f"checksum mismatch on a frame of type {kind}"))
                continue
            frame_type = types.get(kind)
            if frame_type is None:
                append(FrameError("unknown_type", f"unknown frame type {kind}"))
                continue
            raw_subject = raw[HEAD_BYTES : HEAD_BYTES + subject_length]
            source, subject = text.get(raw_source), text.get(raw_subject)
            try:
                if source is None:
                    source = self._remember(raw_source, raw_source.rstrip(b"\x00").decode())
                if subject is None:
                    subject = self._remember(raw_subject, raw_subject.decode())
            except UnicodeDecodeError:
                append(FrameError("bad_text", "a source or subject that is not UTF-8"))
                continue
            payload = raw[HEAD_BYTES + subject_length + _MIDDLE_BYTES : body_end]
            if frame_type is FrameType.EVENT and payload_length < _STAMP.size:
                append(FrameError("short_event", "an EVENT without its timestamp"))
                continue
            append(Frame(frame_type, flags, source, subject, sequence, payload, raw))
        self._buffer = buffer[start:]
        return out

    @property
    def text(self) -> dict[bytes, str]:
        """The sources and subjects decoded so far, by their raw bytes."""
        return self._text

    @property
    def pending(self) -> int:
        """Bytes of a frame not yet whole."""
        return len(self._buffer) + self._chunked

    def _remember(self, raw: bytes, text: str) -> str:
        if len(self._text) >= _TEXT_CACHE:
            self._text.clear()
        self._text[raw] = text
        return text

    def _break(self, out: list[Frame | FrameError], detail: str) -> list[Frame | FrameError]:
        self.broken = True
        self._buffer, self._chunks, self._chunked, self._needed = b"", [], 0, 0
        out.append(FrameError("too_large", detail, fatal=True))
        return out


class Hello(msgspec.Struct, frozen=True):
    """HELLO's payload (MessagePack): who is connecting, as what, its challenge (``nonce``, see
    :mod:`.handshake`), and (answering) why it was refused."""

    protocol: int
    node: str
    cluster: str
    role: Literal["route", "client", "gateway", "mate"]
    epoch: int = 0  # the node's start time: a peer that restarted has a new one
    nonce: bytes = b""
    error: str = ""
    batched_acks: bool = False  # a client's: it takes one ACK for many stored events
    origin: str = ""  # a client's: the origin it had (to keep it, with its ticket from that AUTH)
    ticket: bytes = b""
    vpn: str = ""  # a client's: the Message VPN it asks for; the node's answer: the one it gave ("": default)
    interest_batches: bool = False  # a node's: it takes INTEREST frames (older nodes: SUB_ADD / SUB_REMOVE)


def restamp(raw: bytes, source: str) -> bytes:
    """A frame as it was, with another source (and its checksum made again)."""
    body = raw[:2] + source.encode().ljust(NODE_ID_BYTES, b"\x00") + raw[HEAD_BYTES - 2 : -_CRC_BYTES]
    return body + _CRC.pack(zlib.crc32(body))


class Login(msgspec.Struct, frozen=True):
    """LOGIN's payload from a client (MessagePack), sent only once the session is sealed."""

    user: str
    password: str


class SyncResponse(msgspec.Struct, frozen=True):
    """SYNC_RESP's payload: the whole content of every bucket that differed, at ``version``."""

    version: int
    buckets: dict[int, list[str]]


class InterestChange(msgspec.Struct, frozen=True, array_like=True):
    """One change an INTEREST frame carries, as a SUB_ADD (``added``) or SUB_REMOVE would."""

    added: bool
    pattern: str
    version: int


INTEREST_CHANGES_PER_FRAME = 4096  # at most, in one INTEREST frame (a few hundred KB)


def payload_decoder(kind: type[T], name: str) -> Callable[[bytes], T]:
    """A MessagePack payload's decoder that raises ValueError on anything but a well-formed one."""
    decoder = msgspec.msgpack.Decoder(kind)

    def decode(payload: bytes) -> T:
        try:
            return decoder.decode(payload)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed {name}: {exc}") from None

    return decode


encode_payload = msgspec.msgpack.Encoder().encode
decode_hello = payload_decoder(Hello, "HELLO")
decode_sync = payload_decoder(SyncResponse, "SYNC_RESP")
decode_login = payload_decoder(Login, "LOGIN")
decode_interest = payload_decoder(list[InterestChange], "INTEREST")
