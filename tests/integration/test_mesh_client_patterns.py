"""One client's patterns are bounded (``max_patterns_per_client``): past it a SUB_ADD is dropped and
counted, and the count is read without copying the client's patterns at each SUB_ADD (issue 60: the
copy made 100,000 subscriptions across 100 clients quadratic)."""

from __future__ import annotations

from meshplane.launchers import free_port
from meshplane.mesh.client import MeshClient
from meshplane.mesh.config import MeshConfig
from meshplane.mesh.node import MeshNode
from tests.helpers import eventually

LIMIT = 5


async def test_a_client_holds_at_most_its_limit_of_patterns_and_the_rest_are_counted() -> None:
    node = MeshNode(MeshConfig(node_id="p", route_port=free_port(), max_patterns_per_client=LIMIT))
    await node.start()
    client = await MeshClient(node.route_url).connect()
    try:
        for n in range(LIMIT + 3):
            client.subscribe(f"limit.{n}", lambda subject, body: None)
        client.subscribe("limit.0", lambda subject, body: None)  # held already: no new pattern
        await client.flush()
        (session,) = node.clients.sessions.values()
        await eventually(lambda: node.frame_errors["client_pattern_limit"] == 3)
        assert node.router.count_of(session) == LIMIT
        assert node.router.patterns_of(session) == {f"limit.{n}" for n in range(LIMIT)}
        assert node.status()["clients"][0]["patterns"] == LIMIT
    finally:
        await client.close()
        await node.close()
