"""ATTACK (reviewer's reproduction, failing on today's code): a node given only the clients' secret
(``MESHPLANE_MESH_CLIENT_SECRET``, no ``MESHPLANE_MESH_MEMBER_SECRET`` nor the old single secret)
takes any route with no secret at all. ``MeshConfig.secret`` defaults to "" (src/meshplane/mesh/config.py)
and ``Handshakes._secret`` proves members with it, and nothing says so at start (``one_secret`` only
warns about the opposite mistake). So the operator who set up "credentials" has a mesh where a peer
without any secret links as a node, and sees client secrets refused in their tests.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

from meshplane.launchers import StreamsServerProcess
from meshplane.launchers.base import ServerError, free_port

SECRETS = ("MESHPLANE_MESH_SECRET", "MESHPLANE_MESH_MEMBER_SECRET", "MESHPLANE_MESH_CLIENT_SECRET")


def _links(url: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{url}/mesh", timeout=2) as response:
        links: list[dict[str, object]] = json.load(response)["links"]
    return links


def test_a_node_with_only_a_client_secret_refuses_a_route_without_secret() -> None:
    for name in SECRETS:
        assert name not in os.environ
    port = free_port()
    guarded = StreamsServerProcess(
        extra_args=("--node-id", "a", "--cluster", "c1", "--route-port", str(port)),
        env={"MESHPLANE_MESH_CLIENT_SECRET": "clients-only-secret-123456"},
    )
    stranger = StreamsServerProcess(
        extra_args=("--node-id", "z", "--cluster", "c1", "--routes", f"tcp://127.0.0.1:{port}"),
    )
    try:
        try:
            guarded.start()
        except ServerError:
            return  # refusing to start without a members' secret is a fix too
        stranger.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            up = [link for link in _links(guarded.url) if link["peer"] == "z" and link["state"] == "up"]
            assert not up, f"a peer with no secret linked as a member: {up}"
            time.sleep(0.2)
    finally:
        stranger.stop()
        guarded.stop()
