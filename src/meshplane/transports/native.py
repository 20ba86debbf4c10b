"""The event plane's hot paths in C (``_native.c``), bound to the libzmq that pyzmq loaded.

Optional: without the extension (no C compiler at install, another pyzmq backend, or
``MESHPLANE_NO_EXTENSIONS=1``) :func:`native_receive`, :func:`native_sender` and
:func:`native_nats_decode` are None and the transports go through pyzmq and the Python decoders. The
decoders take only the path where nothing is wrong; every other message comes back as it arrived for
the Python decoders, so both paths accept and refuse exactly the same messages. The sender writes the
envelope from a template that must be msgspec's own encoding.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import struct
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import zmq

from meshplane.core.batches import batch_topic
from meshplane.core.envelope import Codec, EventEnvelope, msgpack_envelope_encoder
from meshplane.core.framing import EVENT_MSGPACK_HEAD, HEARTBEAT_SUFFIX, WireFormat

log = logging.getLogger(__name__)

#: What a subscriber's events are, for the compiled receive: (EventEnvelope, topic, topic as UTF-8).
ExpectedEnvelope = tuple[type[EventEnvelope], str, bytes]
#: ``(publisher_id, first_sequence)`` of a batch that is one publisher's consecutive events, or None.
Run = tuple[int, int] | None
#: ``receive(socket_address, topic, max_bytes, max_messages, decode, out, expected, batch_topic)
#: -> (unusual, errno, run)``
NativeReceive = Callable[
    [int, bytes, int, int, Callable[[bytes], Any], list[Any], ExpectedEnvelope | None, bytes | None],
    tuple[int, int, Run],
]
#: ``decode_nats(messages, max_bytes, decode, out, expected) -> (unusual, run)``
NativeNatsDecode = Callable[
    [list[bytes], int, Callable[[bytes], Any], list[Any], ExpectedEnvelope | None], tuple[int, Run]
]
#: ``send(sequence, payload) -> errno``: 0 when sent, else nothing was sent (see ``send_event`` in C)
NativeSend = Callable[[int, bytes], int]
#: ``send_many(first_sequence, payloads, start) -> (sent, errno)`` (see ``send_events`` in C)
NativeSendMany = Callable[[int, list[bytes], int], tuple[int, int]]
#: ``send_batches(first_sequence, payloads, start, batch_bytes) -> (sent, errno)`` (``send_batches`` in C)
NativeSendBatches = Callable[[int, list[bytes], int, int], tuple[int, int]]


class NativeSenders(NamedTuple):
    """A publisher's compiled sends: one event, a list of them, and a list as batch messages."""

    one: NativeSend
    many: NativeSendMany
    batches: NativeSendBatches


_LIBZMQ_FUNCTIONS = (
    "zmq_msg_init",
    "zmq_msg_recv",
    "zmq_msg_close",
    "zmq_msg_data",
    "zmq_msg_size",
    "zmq_msg_more",
    "zmq_errno",
    "zmq_msg_init_size",
    "zmq_msg_send",
    "zmq_send",
)


def _load() -> types.ModuleType | None:
    try:
        import zmq.backend.cython._zmq as pyzmq_backend

        from meshplane.transports import _native
    except ImportError:
        return None
    try:
        # The backend's own handle: dlsym searches it and its dependencies, so this finds the libzmq
        # pyzmq itself calls (bundled or the system's), never another one in the process.
        backend = ctypes.CDLL(pyzmq_backend.__file__)
        found = [ctypes.cast(getattr(backend, name), ctypes.c_void_p).value for name in _LIBZMQ_FUNCTIONS]
    except (OSError, AttributeError) as exc:
        log.info("compiled ZeroMQ paths unavailable (%s); going through pyzmq", exc)
        return None
    addresses = tuple(address for address in found if address)
    if len(addresses) != len(_LIBZMQ_FUNCTIONS):
        return None
    _native.bind(addresses, EVENT_MSGPACK_HEAD, HEARTBEAT_SUFFIX)
    module: types.ModuleType = _native
    return module


_NATIVE = _load()


def _enabled() -> types.ModuleType | None:
    """The extension, unless ``MESHPLANE_NO_EXTENSIONS`` is set (read at each socket's opening)."""
    if os.environ.get("MESHPLANE_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    return _NATIVE


def native_receive() -> NativeReceive | None:
    """The compiled receive loop (``receive`` in C), or None."""
    native = _enabled()
    return None if native is None else native.receive


def expected_envelope(topic: str) -> ExpectedEnvelope | None:
    """What the compiled receive reads without the decoder: envelopes of ``topic`` (None for a topic
    that ends like a heartbeat's, which Dynamo's layout tells apart by topic alone)."""
    if topic.endswith(HEARTBEAT_SUFFIX):
        return None
    return (EventEnvelope, topic, topic.encode())


def native_nats_decode() -> NativeNatsDecode | None:
    """The compiled decoder of NATS messages (``decode_nats`` in C), or None."""
    native = _enabled()
    return None if native is None else native.decode_nats


def native_sender(
    sock: zmq.Socket[bytes],
    routing_topic: bytes,
    publisher_id: int,
    envelope_topic: str,
    wire: WireFormat,
    codec: Codec,
) -> NativeSenders | None:
    """The compiled sends of one publisher's events; None without the extension, for codecs other than
    MessagePack, or if msgspec would encode the envelope otherwise."""
    native = _enabled()
    if native is None or codec is not Codec.MSGPACK:
        return None
    pack = msgspec.msgpack.encode
    prefix = b"\x85" + pack("publisher_id") + pack(publisher_id) + pack("sequence")
    middle = pack("published_at")
    suffix = pack("topic") + pack(envelope_topic) + pack("payload")
    # The template is trusted only as far as it reproduces msgspec's encoding of this publisher's envelope.
    sample = msgpack_envelope_encoder.encode(EventEnvelope(publisher_id, 0, 0, envelope_topic, b""))
    if sample != prefix + pack(0) + middle + pack(0) + suffix + pack(b""):
        log.warning("msgspec encodes envelopes differently than expected; sending through pyzmq")
        return None
    pid_frame = struct.pack(">Q", publisher_id) if wire is WireFormat.DYNAMO else None
    template = (sock.underlying, routing_topic, pid_frame, prefix, middle, suffix)
    batches = (sock.underlying, batch_topic(routing_topic), None, prefix, middle, suffix)
    return NativeSenders(
        functools.partial(native.send_event, *template),
        functools.partial(native.send_events, *template),
        functools.partial(native.send_batches, *batches),
    )
