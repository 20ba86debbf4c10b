"""The subscriber's compiled receive loop (``_zmqbatch.c``), bound to the libzmq that pyzmq loaded.

Optional: without the extension (no C compiler at install, another pyzmq backend, or
``MESHPLANE_NO_EXTENSIONS=1``) :func:`native_receive` is None and the transport receives through pyzmq.
The C loop takes only the path where nothing is wrong; every other message comes back as its frames
for the Python decoders, so both paths accept and refuse exactly the same messages.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from typing import Any

from meshplane.core.framing import EVENT_MSGPACK_HEAD, HEARTBEAT_SUFFIX

log = logging.getLogger(__name__)

#: ``receive(socket_address, topic, max_bytes, max_messages, decode, out) -> (unusual, errno)``
NativeReceive = Callable[[int, bytes, int, int, Callable[[bytes], Any], list[Any]], tuple[int, int]]

_LIBZMQ_FUNCTIONS = (
    "zmq_msg_init",
    "zmq_msg_recv",
    "zmq_msg_close",
    "zmq_msg_data",
    "zmq_msg_size",
    "zmq_msg_more",
    "zmq_errno",
)


def _load() -> NativeReceive | None:
    try:
        import zmq.backend.cython._zmq as pyzmq_backend

        from meshplane.transports import _zmqbatch  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        # The backend's own handle: dlsym searches it and its dependencies, so this finds the libzmq
        # pyzmq itself calls (bundled or the system's), never another one in the process.
        backend = ctypes.CDLL(pyzmq_backend.__file__)
        addresses = [ctypes.cast(getattr(backend, name), ctypes.c_void_p).value for name in _LIBZMQ_FUNCTIONS]
    except (OSError, AttributeError) as exc:
        log.info("compiled ZeroMQ receive unavailable (%s); receiving through pyzmq", exc)
        return None
    _zmqbatch.bind(*addresses, EVENT_MSGPACK_HEAD, HEARTBEAT_SUFFIX)
    receive: NativeReceive = _zmqbatch.receive
    return receive


_NATIVE = _load()


def native_receive() -> NativeReceive | None:
    """The compiled loop, unless ``MESHPLANE_NO_EXTENSIONS`` is set (read at each subscriber's start)."""
    if os.environ.get("MESHPLANE_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    return _NATIVE
