"""Types of the C extension ``_native.c`` (see there and ``native.py``)."""

from collections.abc import Callable
from typing import Any

def bind(libzmq_functions: tuple[int, ...], event_head: bytes, heartbeat_suffix: str, /) -> None:
    """The addresses of zmq_msg_init, _recv, _close, _data, _size, _more, zmq_errno, zmq_msg_init_size,
    zmq_msg_send and zmq_send, in that order."""

def receive(
    socket_address: int,
    topic: bytes,
    max_bytes: int,
    max_messages: int,
    decode: Callable[[bytes], Any],
    out: list[Any],
    expected: tuple[type, str, bytes] | None,
    batch_topic: bytes | None,
    /,
) -> tuple[int, int, tuple[int, int] | None]: ...
def decode_nats(
    messages: list[bytes],
    max_bytes: int,
    decode: Callable[[bytes], Any],
    out: list[Any],
    expected: tuple[type, str, bytes] | None,
    /,
) -> tuple[int, tuple[int, int] | None]: ...
def send_event(
    socket_address: int,
    topic: bytes,
    pid_frame: bytes | None,
    prefix: bytes,
    middle: bytes,
    suffix: bytes,
    sequence: int,
    payload: bytes,
    /,
) -> int: ...
def send_events(
    socket_address: int,
    topic: bytes,
    pid_frame: bytes | None,
    prefix: bytes,
    middle: bytes,
    suffix: bytes,
    first_sequence: int,
    payloads: list[bytes],
    start: int,
    /,
) -> tuple[int, int]: ...
def send_batches(
    socket_address: int,
    batch_topic: bytes,
    pid_frame: None,
    prefix: bytes,
    middle: bytes,
    suffix: bytes,
    first_sequence: int,
    payloads: list[bytes],
    start: int,
    batch_bytes: int,
    /,
) -> tuple[int, int]: ...
