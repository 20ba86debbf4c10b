"""Mesh nodes started by the launcher side by side each get a free route port (none is given the
default 16500), and a restart keeps the one it got, as its peers know it."""

from __future__ import annotations

import signal

from meshplane.launchers import StreamsServerProcess


def test_two_mesh_nodes_started_side_by_side_get_their_own_route_ports() -> None:
    first = StreamsServerProcess(extra_args=("--node-id", "a"))
    second = StreamsServerProcess(extra_args=("--node-id", "b"))
    with first, second:
        first.start()
        second.start()  # took the default port the first holds, before: "address already in use"
        routes = {node.announced["mesh"]["route_url"] for node in (first, second)}
        assert len(routes) == 2, routes
        before = first.announced["mesh"]["route_url"]
        first.kill(signal.SIGKILL)
        first.start()
        assert first.announced["mesh"]["route_url"] == before
