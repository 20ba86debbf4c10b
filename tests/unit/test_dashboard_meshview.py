"""The dashboard's mesh view against what discovery holds: records anyone who may write to discovery
could have put there, and nodes that answer more than the view draws."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from meshplane import PlaneConfig
from meshplane.dashboard import meshview
from meshplane.dashboard.meshview import node_key, node_record, read_mesh_view
from meshplane.discovery.mem import MemoryDiscovery


class FakeNode:
    """An HTTP server on loopback that records the paths asked and answers ``status`` at each."""

    def __init__(self, status: dict[str, Any], delay: float = 0.0) -> None:
        self.status, self.delay = status, delay
        self.paths: list[str] = []
        self.in_flight = self.most_in_flight = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path_qs)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            return web.json_response(self.status)
        finally:
            self.in_flight -= 1


@pytest.fixture
async def fake_node() -> AsyncIterator[FakeNode]:
    node = FakeNode({"links": []})
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", node.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    node.url = f"http://127.0.0.1:{port}"
    yield node
    await runner.cleanup()


@contextlib.asynccontextmanager
async def registered(records: dict[str, bytes]) -> AsyncIterator[MemoryDiscovery]:
    """The records in the process's memory discovery, gone afterwards."""
    discovery = MemoryDiscovery()
    await discovery.start()
    try:
        for key, value in records.items():
            await discovery.register(key, value)
        yield discovery
    finally:
        await discovery.close()


@pytest.mark.parametrize("tail", ["/internal/admin?x=", "/internal/admin#", "/internal/admin"])
async def test_a_record_asks_only_for_get_mesh_at_the_address_it_names(
    fake_node: FakeNode, tail: str
) -> None:
    """A record's URL with a path, a query or a fragment must not choose what the dashboard's server
    fetches (``url + "/mesh"``: a '#' or '?' in the URL turned "/mesh" into a fragment or a query)."""
    async with registered({node_key("c", "n"): node_record("n", "c", fake_node.url + tail)}) as discovery:
        await read_mesh_view(discovery, None)
    assert all(path == "/mesh" for path in fake_node.paths), fake_node.paths


async def test_a_node_that_answers_huge_lists_is_drawn_bounded(fake_node: FakeNode) -> None:
    """An answer longer than one read (about 128 kB) was cut short and drawn as "not reached". Each
    node's answer is held in the dashboard's state and sent to every viewer each second: a
    node (or a record pointing at anything) answering megabytes of tiny entries must not become a state
    many times that size."""
    entry = {"peer": "p"}
    count = meshview.MAX_STATUS_BYTES // 2 // len(json.dumps(entry) + ", ")
    fake_node.status = {
        "links": [entry] * count,
        "guaranteed": {"queues": [{"name": "q"}] * 10, "spools": [{"peer": "s"}] * 10},
    }
    async with registered({node_key("c", "n"): node_record("n", "c", fake_node.url)}) as discovery:
        view = await read_mesh_view(discovery, None)
    assert view is not None
    assert "error" not in view[0], view[0]["error"]  # an answer longer than one read() was cut short
    assert len(view[0]["links"]) == meshview.MAX_DRAWN
    drawn = len(json.dumps(view))
    assert drawn < meshview.MAX_STATUS_BYTES // 4, f"{count} links answered: {drawn} bytes drawn"


async def test_the_nodes_are_asked_a_few_at_a_time(fake_node: FakeNode) -> None:
    """Up to MAX_NODES records, each answer read up to MAX_STATUS_BYTES and parsed: asking them all at
    once holds all of them in memory together."""
    fake_node.delay = 0.2
    records = {
        node_key("c", f"n{i}"): node_record(f"n{i}", "c", fake_node.url) for i in range(meshview.MAX_NODES)
    }
    async with registered(records) as discovery:
        view = await read_mesh_view(discovery, None)
    assert view is not None
    assert len(view) == meshview.MAX_NODES
    assert all("error" not in node for node in view), view[0]
    assert fake_node.most_in_flight <= 16, f"{fake_node.most_in_flight} asked at once"


def test_mesh_nodes_the_tests_start_register_in_a_discovery_folder_of_their_own() -> None:
    """Every ``serve --node-id`` registers in discovery, by default the user's state folder: tests
    that start nodes without a discovery of their own (MeshCluster, StreamsServerProcess) wrote there,
    where parallel runs and the developer's own nodes and dashboards see them."""
    folder = PlaneConfig.from_env().file_kv
    assert folder.is_relative_to(tempfile.gettempdir()), folder
