"""ZeroMQ sockets that take events refuse frames beyond their byte limit inside libzmq (ZMQ_MAXMSGSIZE:
the peer is dropped before the frame is buffered), not after a whole oversized message was read;
an event a little over the limit is still read and counted (test_wire_interop)."""

from __future__ import annotations

import zmq

from meshplane.core.framing import max_frame_bytes
from meshplane.transports.zmq import ZmqSubscriberTransport


async def test_every_subscriber_socket_has_its_byte_limit_in_libzmq() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    subscriber = ZmqSubscriberTransport(context, b"topic", 1000, 10_000)
    await subscriber.start()
    try:
        assert subscriber._socket is not None
        assert subscriber._socket.getsockopt(zmq.MAXMSGSIZE) == max_frame_bytes(10_000)
    finally:
        await subscriber.close()
        context.term()
