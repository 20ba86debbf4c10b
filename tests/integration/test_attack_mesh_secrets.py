"""A reviewer's attack: a node given only the clients' secret (``MESHPLANE_MESH_CLIENT_SECRET``, no
``MESHPLANE_MESH_MEMBER_SECRET`` nor the old single secret) let a peer holding no secret at all link as
a node, saying nothing. Now it refuses to start, naming the variable to set."""

from __future__ import annotations

import os

import pytest

from meshplane.launchers import StreamsServerProcess
from meshplane.launchers.base import ServerError


def test_a_node_with_only_the_clients_secret_refuses_to_start() -> None:
    guarded = StreamsServerProcess(
        extra_args=("--node-id", "a", "--cluster", "c1", "--route-port", "0"),
        env={  # only the clients' secret: no members' one, nor the old single secret
            **{k: v for k, v in os.environ.items() if not k.startswith("MESHPLANE_MESH_")},
            "MESHPLANE_MESH_CLIENT_SECRET": "clients-only-secret-123456",
        },
    )
    try:
        with pytest.raises(ServerError):  # it refuses to start, saying why, before any peer can link
            guarded.start(timeout=20)
        assert "MESHPLANE_MESH_MEMBER_SECRET too" in guarded.log_path.read_text()
    finally:
        guarded.stop()
