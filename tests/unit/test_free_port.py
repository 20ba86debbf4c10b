"""free_port: a port held for the server it is meant for, from the moment it is picked."""

from __future__ import annotations

import errno
import socket

import pytest

from meshplane.launchers import free_port


def test_a_picked_port_is_refused_to_everyone_but_a_listener_that_reuses_addresses() -> None:
    port = free_port()
    # What the kernel does for another process's bind (and its choice of ports for bind(0) and
    # outgoing connections): the port is taken.
    with socket.socket() as other, pytest.raises(OSError, match="in use") as refused:
        other.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    # What a server does with it (asyncio, Go's net, libzmq all set SO_REUSEADDR): it listens.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = server.accept()
            accepted.close()


def test_ports_picked_together_differ() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
