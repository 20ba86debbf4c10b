"""The mesh client's own state, without a node: what it remembers stays bounded."""

from __future__ import annotations

from typing import Any

from meshplane.core.mesh.frames import Frame, FrameType
from meshplane.mesh.client import CACHED_SUBJECTS, MeshClient


async def test_a_wildcard_subscriber_remembers_a_bounded_number_of_subjects() -> None:
    client = MeshClient("tcp://127.0.0.1:9")
    got: list[str] = []
    client.subscribe(">", lambda subject, body: got.append(subject))
    connection: Any = None  # frames are handed over as a connection would
    for n in range(CACHED_SUBJECTS + 10):
        client._on_frame(connection, Frame(FrameType.EVENT, 0, "n", f"s.{n}", n, bytes(8) + b"x"))
    assert got == [f"s.{n}" for n in range(CACHED_SUBJECTS + 10)]
    assert len(client._cache) <= CACHED_SUBJECTS
