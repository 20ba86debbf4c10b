"""One node's guaranteed path in process: a queue of its own, dedup by event id, the bound on what
waits for a commit, and failed writes that answer "not stored" and leave nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from meshplane.core.mesh.frames import (
    FLAG_BATCHED_ACKS,
    FLAG_GUARANTEED,
    Frame,
    FrameType,
    batched_ack_sequences,
    encode_event,
)
from meshplane.errors import ConfigError
from meshplane.mesh import guaranteed as guaranteed_module
from meshplane.mesh import queue_items as queues_module
from meshplane.mesh.client import MeshClient
from meshplane.mesh.commit_batch import Work, store_batch
from meshplane.mesh.config import MeshConfig
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.lease import LeaseLost
from meshplane.mesh.node import MeshNode
from meshplane.mesh.queue_items import Queue, RecentIds
from meshplane.mesh.queue_journal import QueueJournal
from meshplane.mesh.spool import SpoolLimits
from meshplane.mesh.vpns import parse_vpns
from meshplane.streams import durability as durability_module
from meshplane.streams.config import StreamsConfig
from meshplane.streams.errors import (
    BadRequest,
    Conflict,
    LimitReached,
    NotStored,
    OutcomeUnknown,
    StorageError,
)
from meshplane.streams.service import StreamsService
from tests.faults import FaultInjector
from tests.helpers import eventually
from tests.mesh_peers import RawPeer


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[MeshNode]:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path / "data", fsync="always"))
    await engine.start()
    mesh = MeshNode(MeshConfig(node_id="a"))
    mesh.attach(engine)
    await mesh.start()
    yield mesh
    await mesh.close()
    await engine.close()


def queue_events(node: MeshNode, name: str) -> list[tuple[str, object]]:
    engine = node.guaranteed.engine
    assert engine is not None
    return [(e.body.id, e.body.data) for e in engine.topic_store.get(name).read(0, 0, 1000)]


async def test_a_queue_on_the_publishing_node_stores_each_event_id_once(node: MeshNode) -> None:
    node.guaranteed.queues.create("local", ["orders.>"])
    await node.publish_guaranteed("orders.eu", b"one")
    await node.publish_guaranteed("payments.eu", b"not for the queue")
    repeat = MeshEvent("client", "orders.eu", 7, 1000, b"twice", FLAG_GUARANTEED)
    await node.guaranteed.publish_async(repeat)
    await node.guaranteed.publish_async(repeat)  # a client's resend: the same id
    stored = queue_events(node, "local")
    assert [data for _, data in stored] == [b"one", b"twice"]
    assert stored[1][0] == "1000-7-client"
    assert node.guaranteed.counters["duplicates_dropped"] == 1


async def test_queues_are_checked_and_persisted(node: MeshNode, tmp_path: Path) -> None:
    for patterns in ([], ["a..b"], ["$G.x"], ["ok"] * 101):
        with pytest.raises(BadRequest):
            node.guaranteed.queues.create("q", patterns)
    node.guaranteed.queues.create("q", ["b.*", "a.>", "a.>"])
    journal = tmp_path / "data" / "mesh" / "queues.log"
    assert journal.read_text() == '{"name":"q","patterns":["a.>","b.*"]}\n'
    assert node.guaranteed.queues.delete("q")
    assert not node.guaranteed.queues.delete("q")
    assert journal.read_text().splitlines()[1:] == ['{"name":"q"}']


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=errno.errorcode.get)
@pytest.mark.parametrize("fail_at", [1, 2, 3])  # the journal's open, its write, its fsync
async def test_a_queue_whose_record_failed_is_not_made_and_the_next_one_is(
    node: MeshNode, tmp_path: Path, error: int, fail_at: int
) -> None:
    queues = node.guaranteed.queues
    queues.create("kept", ["a.>"])
    queues._journal.close()  # type: ignore[union-attr]  # reopened: the open is the first operation
    mesh_dir = tmp_path / "data" / "mesh"
    injector = FaultInjector(mesh_dir, fail_at=fail_at, error=error)
    with injector.installed(), pytest.raises(StorageError):
        queues.create("lost", ["b.>"])
    assert injector.failed is not None
    assert injector.failed[1].endswith("queues.log")
    assert "lost" not in queues.queues
    assert not node.router.route("$G.b.x").local  # never advertised
    queues.create("after", ["c.>"])
    assert QueueJournal(mesh_dir).load() == {"kept": ["a.>"], "after": ["c.>"]}


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=errno.errorcode.get)
async def test_queues_made_at_once_share_one_fsync_and_a_failed_one_makes_none_of_them(
    node: MeshNode, tmp_path: Path, error: int
) -> None:
    queues = node.guaranteed.queues
    await queues.make("kept", ["a.>"])
    mesh_dir = tmp_path / "data" / "mesh"
    counted = FaultInjector(mesh_dir)
    with counted.installed():
        await asyncio.gather(*(queues.make(f"q{i}", [f"q{i}.>"]) for i in range(4)))
    assert [op for op, _ in counted.seen].count("fsync") == 1  # four lines, one fsync
    failing = FaultInjector(mesh_dir, fail_at=5, error=error)  # four appends, then their fsync
    with failing.installed():
        results = await asyncio.gather(
            *(queues.make(f"lost{i}", [f"lost{i}.>"]) for i in range(4)), return_exceptions=True
        )
    assert failing.failed is not None
    assert failing.failed[0] == "fsync"
    assert all(isinstance(r, StorageError) for r in results)
    assert not any(f"lost{i}" in queues.queues for i in range(4))
    assert not node.router.route("$G.lost0.x").local  # never advertised
    await queues.make("after", ["c.>"])
    expected = {"kept": ["a.>"], "after": ["c.>"]} | {f"q{i}": [f"q{i}.>"] for i in range(4)}
    assert QueueJournal(mesh_dir).load() == expected


async def test_a_queue_being_changed_is_not_deleted_under_the_change(node: MeshNode) -> None:
    queues = node.guaranteed.queues
    await queues.make("q", ["a.>"])
    change = asyncio.ensure_future(queues.make("q", ["b.>"]))
    await asyncio.sleep(0)  # its fsyncs under way
    with pytest.raises(Conflict):
        queues.delete("q")
    assert (await change).patterns == ["b.>"]
    assert queues.delete("q")
    assert "q" not in QueueJournal(queues._root).load()


class FsyncFault(FaultInjector):
    """ENOSPC/EIO at the fsync of one path (the two fsyncs of a topic run at once, in any order)."""

    def __init__(self, root: Path, path: Path) -> None:
        super().__init__(root, error=errno.EIO)
        self.path = str(path)

    def _check(self, operation: str, path: str) -> None:
        if operation == "fsync" and path == self.path and self.failed is None:
            self.failed = (operation, path)
            raise OSError(self.error, "injected", path)


@pytest.mark.parametrize("which", ["topic.json", "directory"])
async def test_a_queue_whose_topic_could_not_be_made_durable_is_not_made(
    node: MeshNode, tmp_path: Path, which: str
) -> None:
    queues = node.guaranteed.queues
    assert queues.engine is not None
    directory = queues.engine.topic_store.folder / "lost"
    injector = FsyncFault(directory, directory / "topic.json" if which == "topic.json" else directory)
    with injector.installed(), pytest.raises(StorageError):
        await queues.make("lost", ["b.>"])
    assert injector.failed is not None
    assert injector.failed[0] == "fsync"
    assert "lost" not in queues.queues
    assert not node.router.route("$G.b.x").local
    assert "lost" not in QueueJournal(tmp_path / "data" / "mesh").load()  # its record undone


def test_a_node_keeps_at_most_its_max_queues() -> None:
    with pytest.raises(ConfigError):
        MeshConfig(node_id="a", max_queues=-1)


async def test_the_queue_limit_is_the_node_s_setting(tmp_path: Path) -> None:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path / "data"))
    await engine.start()
    mesh = MeshNode(MeshConfig(node_id="a", max_queues=3))
    mesh.attach(engine)
    await mesh.start()
    try:
        for i in range(3):
            mesh.guaranteed.queues.create(f"q{i}", [f"q{i}.>"])
        with pytest.raises(LimitReached, match="3 queues on this node"):
            mesh.guaranteed.queues.create("q3", ["q3.>"])
        mesh.guaranteed.queues.create("q0", ["other.>"])  # a change of one it has: allowed
    finally:
        await mesh.close()
        await engine.close()


async def test_what_waits_for_a_commit_is_bounded(node: MeshNode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guaranteed_module, "MAX_WAITING", 2)
    answers: list[str] = []
    for i in range(3):  # no await between them: the commit loop has not run yet
        event = MeshEvent("client", "orders.eu", i, 1000, b"x", FLAG_GUARANTEED)
        node.guaranteed.publish(event, lambda _, error: answers.append(error))
    assert answers == ["the node is busy: 2 guaranteed events wait to be stored; retry"]
    assert node.guaranteed.counters["refused_busy"] == 1


async def test_a_spool_filled_within_one_commit_refuses_only_what_is_beyond_its_room(
    node: MeshNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.guaranteed, "limits", SpoolLimits(max_events=3))
    assert node.guaranteed.peers is not None
    node.guaranteed.peers.learnt("b", {"orders.>"}, ())  # node b's queue wants orders: spooled for b
    answers: list[str] = []
    for i in range(5):  # one commit: no await between them
        node.guaranteed.publish(
            MeshEvent("client", "orders.eu", i, 1000, b"x", FLAG_GUARANTEED),
            lambda _, error: answers.append(error),
        )
    await eventually(lambda: len(answers) == 5)
    assert answers[:3] == ["", "", ""]
    assert all("spool for node 'b' is full" in answer for answer in answers[3:])
    spool = node.guaranteed.spools["b"]
    assert (spool.pending, spool.refused) == (3, 2)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=errno.errorcode.get)
async def test_a_failed_write_is_not_stored_and_leaves_no_trace(
    node: MeshNode, tmp_path: Path, error: int
) -> None:
    node.guaranteed.queues.create("q", ["orders.>"])
    await node.publish_guaranteed("orders.eu", b"before")
    topic_dir = tmp_path / "data" / "topics"
    injector = FaultInjector(topic_dir, fail_at=1, error=error)
    with injector.installed(), pytest.raises(NotStored, match="nothing was stored"):
        await node.publish_guaranteed("orders.eu", b"lost")
    assert injector.failed is not None
    await node.publish_guaranteed("orders.eu", b"after")
    assert [data for _, data in queue_events(node, "q")] == [b"before", b"after"]


def test_a_queue_remembers_exactly_the_last_ids_it_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queues_module, "RECENT_IDS", 5)
    recent = RecentIds()
    recent.remember(["a", "b", "c"])
    recent.remember(["d", "e", "f", "g"])
    assert recent.ids == {"c", "d", "e", "f", "g"}
    recent.remember(["h"])
    assert recent.ids == {"d", "e", "f", "g", "h"}
    assert len(recent) == 5


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one_by_one"])
async def test_a_client_that_asked_gets_one_ack_for_many_stored_events(node: MeshNode, batched: bool) -> None:
    """A client's HELLO says whether it takes batched ACKs; one that does not (an older client) still
    gets one ACK per event."""
    node.guaranteed.queues.create("q", ["orders.>"])
    client = RawPeer(node.route_url, "c", "", "client", batched_acks=batched)
    await asyncio.to_thread(client.authenticate)
    try:
        client.send(
            *(encode_event(client.origin, "orders.eu", n, 1000, b"x", FLAG_GUARANTEED) for n in range(1, 301))
        )

        def acks() -> list[Frame]:
            frames, confirmed = [], 0
            while confirmed < 300:
                frame = client.read_until(FrameType.ACK)
                frames.append(frame)
                confirmed += frame.sequence if frame.flags & FLAG_BATCHED_ACKS else 1
            return frames

        frames = await asyncio.to_thread(acks)
    finally:
        client.close()
    if batched:
        assert all(frame.flags & FLAG_BATCHED_ACKS for frame in frames)
        assert [n for frame in frames for n in batched_ack_sequences(frame)] == list(range(1, 301))
        assert len(frames) < 300
    else:
        assert [(frame.flags, frame.sequence, frame.payload) for frame in frames] == [
            (0, n, b"") for n in range(1, 301)
        ]
    assert len(queue_events(node, "q")) == 300


async def test_queues_and_spools_made_or_gone_between_publishes_are_seen_at_once(node: MeshNode) -> None:
    """A subject's queues and spools are kept between publishes: they must follow every change."""
    guaranteed = node.guaranteed
    assert guaranteed.peers is not None

    async def publish(n: int) -> None:
        await guaranteed.publish_async(MeshEvent("client", "orders.eu", n, 1000, b"%d" % n, FLAG_GUARANTEED))

    await publish(1)  # nobody wants it yet
    guaranteed.queues.create("first", ["orders.>"])
    guaranteed.peers.learnt("b", {"orders.*"}, ())
    await publish(2)
    guaranteed.queues.delete("first")
    guaranteed.queues.create("second", ["orders.eu"])
    guaranteed.peers.learnt("c", {"orders.eu"}, ())
    guaranteed.peers.learnt("b", (), {"orders.*"})
    await publish(3)
    assert [data for _, data in queue_events(node, "first")] == [b"2"]
    assert [data for _, data in queue_events(node, "second")] == [b"3"]
    assert (guaranteed.spools["b"].pending, guaranteed.spools["c"].pending) == (1, 1)


def test_a_resend_is_known_however_busy_the_other_ways_into_the_queue_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mesh-mates chaos run that stored 10 events twice in b's queue: a mate's spool for b resent
    from a stale confirmed offset after a power loss, while b's own publisher had filled the queue's
    window with its events. Each way into a queue keeps its own window."""
    monkeypatch.setattr(queues_module, "RECENT_IDS", 5)
    recent = RecentIds()
    recent.remember(["a1", "a2", "a3"], way="a")  # spooled from node a
    recent.remember([f"local{n}" for n in range(20)])  # this node's publisher, far busier
    assert {"a1", "a2", "a3"} <= recent.ids
    assert recent.ids >= {f"local{n}" for n in range(15, 20)}
    assert not recent.ids & {f"local{n}" for n in range(15)}


async def test_a_commit_remembers_each_event_by_the_way_it_came(
    node: MeshNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queues_module, "RECENT_IDS", 5)
    queue = node.guaranteed.queues.create("q", ["orders.>"])
    engine = node.guaranteed.engine
    assert engine is not None
    answers: list[str] = []
    counters: Counter[str] = Counter()

    def works(first: int, count: int, way: str) -> list[Work]:
        return [
            Work(
                MeshEvent("o", "orders.eu", n, 1000, b"x"),
                [],
                [queue],
                lambda _, e: answers.append(e),
                n,
                way,
            )
            for n in range(first, first + count)
        ]

    store_batch(engine, works(0, 3, "a"), counters)  # spooled from node a
    store_batch(engine, works(100, 20, ""), counters)  # published here, far more
    store_batch(engine, works(0, 3, "a"), counters)  # node a resends them
    assert counters["duplicates_dropped"] == 3
    assert queue.stored == 23


def spooled_works(queue: Queue, way: str, offsets: range, answers: list[str]) -> list[Work]:
    return [
        Work(
            MeshEvent("o", "orders.eu", n, 1000 + n, b"%d" % n),
            [],
            [queue],
            lambda _, e: answers.append(e),
            n,
            way,
        )
        for n in offsets
    ]


async def test_a_queue_recalls_the_last_offset_of_each_spool_from_its_checkpoint_and_topic(
    node: MeshNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53: what a restart must not forget, whatever else came in between: the checkpoint and
    the events stored after it (each carries its spool and offset); a checkpoint newer than the topic
    (its tail lost in a power loss) is ignored and the topic read whole."""
    monkeypatch.setattr(queues_module, "RECENT_IDS", 2)  # ids alone would not know these resends
    queues = node.guaranteed.queues
    queue = queues.create("q", ["orders.>"])
    engine = node.guaranteed.engine
    assert engine is not None
    answers: list[str] = []
    counters: Counter[str] = Counter()
    store_batch(engine, spooled_works(queue, "a", range(10, 20), answers), counters)
    store_batch(engine, spooled_works(queue, "@c2", range(5, 7), answers), counters)
    queues.save_marks()
    store_batch(engine, spooled_works(queue, "a", range(20, 25), answers), counters)  # after it
    store_batch(engine, works_here(queue, 50, answers), counters)

    def recalled() -> Queue:
        fresh = Queue("q", ["orders.>"])
        queues._recall(fresh)
        return fresh

    assert (recalled().marks.last("a"), recalled().marks.last("@c2")) == (24, 6)
    marks = engine.root / "mesh" / "queue-marks" / f"{b'q'.hex()}.json"
    marks.write_bytes(queue.marks.encode(10_000))  # newer than the topic: not trusted
    assert (recalled().marks.last("a"), recalled().marks.last("@c2")) == (24, 6)
    marks.write_bytes(b"torn")
    assert recalled().marks.last("a") == 24

    queue.marks = recalled().marks
    queue.recent = RecentIds()
    store_batch(engine, spooled_works(queue, "a", range(0, 26), answers), counters)  # a resend, and one new
    assert counters["duplicates_dropped"] == 25
    assert queue.stored == 10 + 2 + 5 + 50 + 1


def works_here(queue: Queue, count: int, answers: list[str]) -> list[Work]:
    return [
        Work(MeshEvent("p", "orders.eu", n, 5000 + n, b"y"), [], [queue], lambda _, e: answers.append(e), n)
        for n in range(count)
    ]


async def test_what_a_link_sent_before_a_failed_store_is_not_stored(node: MeshNode) -> None:
    """Once a store from a link fails, what that link sent before the failure is dropped unstored:
    its queues would otherwise remember offsets past the failed one and drop it when it is resent."""
    guaranteed = node.guaranteed
    queue = guaranteed.queues.create("q", ["orders.>"])
    link = object()
    answers: list[str] = []
    [before] = spooled_works(queue, "a", range(7, 8), answers)
    before.link, before.failures = link, 0  # type: ignore[assignment]
    guaranteed._failures[link] += 1  # type: ignore[index]
    guaranteed._submit(before)
    [after] = spooled_works(queue, "a", range(5, 6), answers)  # the resend, after the failure
    after.link, after.failures = link, 1  # type: ignore[assignment]
    guaranteed._submit(after)
    later: list[str] = []
    guaranteed._submit(works_here(queue, 1, later)[0])
    await eventually(lambda: later == [""], what="everything before stored")
    assert [data for _, data in queue_events(node, "q")] == [b"5", b"y"]
    assert answers == [""]  # the resend's; the stale one is not answered (its link starts over)
    assert queue.marks.last("a") == 5


async def test_an_event_written_but_not_confirmed_by_the_mate_is_unknown_never_not_stored(
    node: MeshNode,
) -> None:
    """Issue 53, item 3: the HA mate's lease ran out after the event was written (and perhaps
    mirrored): the answer says the outcome is unknown, as the event is in the queue; a mesh client
    sends it again with the same id, and the queue keeps it once."""
    node.guaranteed.queues.create("q", ["orders.>"])
    engine = node.guaranteed.engine
    assert engine is not None
    failures = [LeaseLost("this HA mate lost its lease (epoch 7)")]

    async def replicate() -> None:
        if failures:
            raise failures.pop()

    engine.durability.replicate = replicate
    with pytest.raises(OutcomeUnknown, match=r"^unknown: this HA mate lost its lease"):
        await node.publish_guaranteed("orders.eu", b"written")
    assert [data for _, data in queue_events(node, "q")] == [b"written"]

    failures.append(LeaseLost("this HA mate lost its lease (epoch 8)"))
    client = await MeshClient(node.route_url, timeout=10).connect()
    try:
        await client.publish("orders.eu", b"resent", guaranteed=True)  # answered unknown, then stored
    finally:
        await client.close()
    assert [data for _, data in queue_events(node, "q")] == [b"written", b"resent"]
    assert node.guaranteed.counters["duplicates_dropped"] == 1


@contextlib.asynccontextmanager
async def peer_with_a_queue(node: MeshNode, data_dir: Path) -> AsyncIterator[MeshNode]:
    """Node b, routed to ``node``, with a queue on ``orders.>`` that ``node`` knows of."""
    engine = StreamsService(StreamsConfig(data_dir=data_dir, fsync="always"))
    await engine.start()
    b = MeshNode(MeshConfig(node_id="b", routes=(node.route_url,)))
    b.attach(engine)
    await b.start()
    try:
        b.guaranteed.queues.create("q", ["orders.>"])

        def knows_the_queue() -> bool:
            link, peers = node.links.get("b"), node.guaranteed.peers
            linked = link is not None and link.state == "up"
            return linked and peers is not None and "b" in peers.match("orders.eu")

        await eventually(knows_the_queue, what="a linked to b, knowing its queue")
        yield b
    finally:
        await b.close()
        await engine.close()


def unsent(node: MeshNode, peer: str) -> tuple[int, int]:
    """(events the spool for ``peer`` holds unconfirmed, of which not sent yet)."""
    spool = node.guaranteed.spools[peer]
    return spool.pending, spool.log.next_offset - spool.sent


async def test_a_spooled_event_leaves_for_its_peer_only_once_the_standby_has_it(
    node: MeshNode, tmp_path: Path
) -> None:
    """The mesh-mates chaos run (seed 36) that lost an acknowledged event in b's queue: the active mate
    sent a spooled event to b before its standby had it, then died; the standby, serving, spooled
    another event at the same offset, and b dropped it as a resend of the one it held."""
    engine = node.guaranteed.engine
    assert engine is not None
    async with peer_with_a_queue(node, tmp_path / "b") as b:
        mirrored, entered = asyncio.Event(), asyncio.Event()

        async def replicate() -> None:  # the standby's answer to the barrier, held until set
            entered.set()
            await mirrored.wait()

        engine.durability.replicate = replicate
        publish = asyncio.create_task(node.publish_guaranteed("orders.eu", b"held"))
        await asyncio.wait_for(entered.wait(), 10)
        assert unsent(node, "b") == (1, 1), "sent to b (or even confirmed) before the standby had it"
        mirrored.set()
        await asyncio.wait_for(publish, 10)
        await eventually(lambda: [data for _, data in queue_events(b, "q")] == [b"held"], what="b stored it")


async def test_with_fsync_interval_a_spooled_event_leaves_once_on_disk_though_acknowledged_before(
    tmp_path: Path,
) -> None:
    """The same offset reused after a power loss: sent before its fsync, lost from the spool's tail."""
    async with (
        node_fsyncing_rarely(tmp_path / "a") as (node, engine),
        peer_with_a_queue(node, tmp_path / "b") as b,
    ):
        await node.publish_guaranteed("orders.eu", b"acknowledged, not on disk")
        assert unsent(node, "b") == (1, 1), "sent to b before it was on disk"
        await engine.durability.flush()
        await eventually(lambda: len(queue_events(b, "q")) == 1, what="b stored it")


@contextlib.asynccontextmanager
async def node_fsyncing_rarely(data_dir: Path) -> AsyncIterator[tuple[MeshNode, StreamsService]]:
    """Node a with --fsync interval, an interval no test waits for (a test flushes)."""
    engine = StreamsService(StreamsConfig(data_dir=data_dir, fsync="interval", fsync_interval_ms=600_000))
    await engine.start()
    node = MeshNode(MeshConfig(node_id="a"))
    node.attach(engine)
    await node.start()
    try:
        yield node, engine
    finally:
        await node.close()
        await engine.close()


async def test_with_fsync_interval_an_acknowledged_event_whose_fsync_failed_once_still_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interval fsync that fails once: the publisher was acknowledged already, so the spool must
    send the event once a later fsync succeeds, not only when another event happens to be spooled
    for that peer (or the node restarts)."""
    async with (
        node_fsyncing_rarely(tmp_path / "a") as (node, engine),
        peer_with_a_queue(node, tmp_path / "b") as b,
    ):
        real = durability_module._fsync_each
        failures = [errno.EIO]

        def fsync_each(fds: list[int]) -> list[str | None]:
            errors = real(fds)
            return ["Input/output error" for _ in fds] if failures and failures.pop() else errors

        monkeypatch.setattr(durability_module, "_fsync_each", fsync_each)
        await node.publish_guaranteed("orders.eu", b"acknowledged, fsync failed once")
        await engine.durability.flush()  # fails
        assert engine.durability.fsync_errors

        async def stored_after_an_fsync() -> bool:  # the interval's next fsyncs, which succeed
            await engine.durability.flush()
            return len(queue_events(b, "q")) == 1

        await eventually(stored_after_an_fsync, what="b stored it", interval=0.1)


async def test_a_paused_queue_whose_topic_is_made_again_delivers_nothing_until_resumed(
    node: MeshNode,
) -> None:
    """The queue's topic deleted under a paused queue (DELETE /topics/q, an admin's) is made again by
    the next event stored or by a PUT of the queue: the queue still says paused, so its readers must
    still get nothing."""
    engine = node.guaranteed.engine
    assert engine is not None
    node.guaranteed.queues.create("q", ["orders.>"])
    node.guaranteed.queues.pause("q")
    assert await engine.delete_topic("q")
    await node.publish_guaranteed("orders.eu", b"while paused")
    assert node.guaranteed.queues.queues["q"].paused
    assert await engine.read_topic("q", 0, 0, 10) == [], "a paused queue's topic delivered"
    assert await engine.delete_topic("q")
    node.guaranteed.queues.create("q", ["orders.>", "refunds.>"])
    await node.publish_guaranteed("refunds.eu", b"still paused")
    assert await engine.read_topic("q", 0, 0, 10) == [], "a paused queue's topic delivered"
    node.guaranteed.queues.pause("q", False)
    assert [e.body.data for e in await engine.read_topic("q", 0, 0, 10)] == [b"still paused"]


async def test_pausing_a_queue_answers_once_the_standby_has_it(node: MeshNode) -> None:
    """docs/mesh.md: a mate's takeover keeps a paused queue paused. An answer given before the standby
    had ``paused.json`` would be undone by a takeover right after it: the queue delivers again."""
    from aiohttp.test_utils import TestClient, TestServer

    from meshplane.streams.http.app import create_app

    engine = node.guaranteed.engine
    assert engine is not None
    node.guaranteed.queues.create("q", ["orders.>"])
    mirrored, entered = asyncio.Event(), asyncio.Event()

    async def replicate() -> None:  # the standby's answer to the barrier, held until set
        entered.set()
        await mirrored.wait()

    engine.durability.replicate = replicate
    async with TestClient(TestServer(create_app(engine, mesh=node))) as http:
        for op in ("pause", "resume"):
            entered.clear()
            mirrored.clear()
            answer = asyncio.create_task(http.post(f"/mesh/queues/q/{op}"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(answer), 1)
            assert not answer.done(), f"{op}: answered before the standby had it"
            assert entered.is_set()
            mirrored.set()
            assert (await answer).status == 200


async def test_with_fsync_interval_a_close_that_fails_after_an_fsync_does_not_stop_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interval's fsync runs on duplicated descriptors, closed after; close(2) may fail (EIO on
    NFS). That failure ended the fsync loop: nothing was ever synced again, so no spool ever sent
    again, while publishers were still acknowledged."""
    engine = StreamsService(StreamsConfig(data_dir=tmp_path / "a", fsync="interval", fsync_interval_ms=20))
    await engine.start()
    node = MeshNode(MeshConfig(node_id="a"))
    node.attach(engine)
    await node.start()
    real = durability_module._fsync_each
    failures = [errno.EIO]

    def fsync_each(fds: list[int]) -> list[str | None]:
        errors = real(fds)  # synced and closed, then: what an os.close raising in its finally does
        if failures:
            raise OSError(failures.pop(), "Input/output error")
        return errors

    try:
        async with peer_with_a_queue(node, tmp_path / "b") as b:
            monkeypatch.setattr(durability_module, "_fsync_each", fsync_each)
            await node.publish_guaranteed("orders.eu", b"first")
            await eventually(lambda: not failures, what="a close failed")
            monkeypatch.undo()
            await node.publish_guaranteed("orders.eu", b"second")
            await eventually(lambda: len(queue_events(b, "q")) == 2, what="b stored both")
    finally:
        await node.close()
        await engine.close()


async def test_a_queue_of_another_vpn_is_paused_resumed_and_deleted_by_its_own_name(tmp_path: Path) -> None:
    engine = StreamsService(StreamsConfig(data_dir=tmp_path / "data", fsync="always"))
    await engine.start()
    node = MeshNode(MeshConfig(node_id="a", vpns=parse_vpns("[vpns.A]\n")))
    node.attach(engine)
    await node.start()
    try:
        queue = node.guaranteed.queues.create("orders", ["orders.>"], vpn="A")
        node.guaranteed.queues.pause(queue.name)
        assert queue.paused
        assert node.guaranteed.queues.delete("orders", vpn="A")
        assert not queue.paused
        assert queue.name not in node.guaranteed.queues.queues
        assert not node.guaranteed.queues.delete("orders", vpn="A")
    finally:
        await node.close()
        await engine.close()
