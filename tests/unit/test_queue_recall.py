"""What a queue recalls on start so that a resend is known (issue 53, item 2): a client's retry
comes the way its first copy did, with the same id, however many events other sources sent into
the queue in between, and after a restart or a power loss."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from meshplane.core.mesh.frames import FLAG_GUARANTEED
from meshplane.core.mesh.source_marks import SourceMarks
from meshplane.core.streamlog import StoredEvent
from meshplane.mesh import queue_items as queues_module
from meshplane.mesh.commit_batch import store_batch
from meshplane.mesh.config import MeshConfig
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.node import MeshNode
from meshplane.streams.config import StreamsConfig
from meshplane.streams.service import StreamsService
from tests.unit.test_mesh_guaranteed import queue_events, spooled_works


@contextlib.asynccontextmanager
async def node_a(data_dir: Path) -> AsyncIterator[MeshNode]:
    engine = StreamsService(StreamsConfig(data_dir=data_dir, fsync="always"))
    await engine.start()
    node = MeshNode(MeshConfig(node_id="a"))
    node.attach(engine)
    await node.start()
    try:
        yield node
    finally:
        await node.close()
        await engine.close()


def stored(node: MeshNode) -> list[object]:
    return [data for _, data in queue_events(node, "q")]


async def test_a_clients_retry_after_a_restart_is_known_however_much_other_sources_sent_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's event stored, its ACK lost; node c's spool then sends more than the queue's id
    window; the node restarts (or loses power: its checkpoint gone) and the client sends the event
    again with the same id: it is stored once."""
    monkeypatch.setattr(queues_module, "RECENT_IDS", 5)
    retry = MeshEvent("client-origin-01", "orders.eu", 7, 1000, b"once", FLAG_GUARANTEED)
    async with node_a(tmp_path) as node:
        queue = node.guaranteed.queues.create("q", ["orders.>"])
        await node.guaranteed.publish_async(retry)
        engine = node.guaranteed.engine
        assert engine is not None
        store_batch(engine, spooled_works(queue, "c", range(100, 120), []), Counter())
        node.guaranteed.tick()  # a heartbeat: the queue's checkpoint
        assert queue.marks.local_from == 0
    async with node_a(tmp_path) as node:  # restarted
        await node.guaranteed.publish_async(retry)
        assert stored(node).count(b"once") == 1
    for checkpoint in (tmp_path / "mesh" / "queue-marks").iterdir():
        checkpoint.unlink()  # not fsynced: a power loss may take it
    async with node_a(tmp_path) as node:
        await node.guaranteed.publish_async(retry)
        assert stored(node).count(b"once") == 1
        assert len(stored(node)) == 21


def test_the_checkpoint_says_where_the_oldest_remembered_id_of_this_nodes_publishers_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queues_module, "RECENT_IDS", 3)
    recent = queues_module.RecentIds()
    assert recent.local_from is None
    recent.remember(["p0", "p1"], "", [10, 11])
    recent.remember([f"c{n}" for n in range(50)], "c", range(12, 62))  # another way: no effect
    assert recent.local_from == 10
    recent.remember(["p2", "p3"], "", [62, 70])
    assert recent.local_from == 11  # p0 forgotten
    assert {"p1", "p2", "p3"} <= recent.ids
    marks = SourceMarks()
    raw = marks.encode(71, recent.local_from)
    again = SourceMarks()
    assert again.load(raw, 71) == 71
    assert again.local_from == 11
    assert again.load(b'{"next_offset": 5, "sources": {}}', 71) == 5  # a checkpoint from before
    assert again.local_from is None


async def test_a_queue_on_a_topic_made_before_it_with_more_partitions_recalls_each_partitions_ids(
    tmp_path: Path,
) -> None:
    async with node_a(tmp_path) as node:
        engine = node.guaranteed.engine
        assert engine is not None
        engine.topic_store.create("q", 2)
        event = StoredEvent(id="1000-7-client-origin-01", event_type="orders.eu", data="x")
        engine.append_topic("q", [event], partition=1)
        node.guaranteed.queues.create("q", ["orders.>"])
        await node.guaranteed.publish_async(
            MeshEvent("client-origin-01", "orders.eu", 7, 1000, b"again", FLAG_GUARANTEED)
        )
        assert node.guaranteed.counters["duplicates_dropped"] == 1
