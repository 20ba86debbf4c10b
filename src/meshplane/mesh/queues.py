"""A node's queues (seed 002's guaranteed subscriptions): checked, kept in
``<data dir>/mesh/queues.log`` (:mod:`.queue_journal`: appended and fsynced before they are
advertised), and subscribed under ``$G.``; at most ``MeshConfig.max_queues`` of them per node.

A queue belongs to a Message VPN (:mod:`meshplane.core.mesh.vpn`): its patterns are kept and routed
with the VPN's prefix (``$G.$vpn:A.orders.>``), so it takes that VPN's events only, and a VPN's queue
``orders`` is stored in the topic ``A:orders`` (the default VPN's in ``orders``, as before VPNs).

Each queue stores its events in the streams topic of its name (keyed by publisher, so that one
publisher's events keep their order) and drops a resend: one from a spool (a peer's, another
cluster's) by the last spool offset it stored from that source (:mod:`meshplane.core.mesh.source_marks`:
checkpointed beside the topic, and rebuilt from the events after the checkpoint, which carry their
source and offset), any other by the ids it stored last: the last of each way in, read back from the
topic on start (those of the node's own publishers from where the checkpoint says their oldest is, so
a client's retry is known however many events other sources sent in between).

A queue made with ``saved=False`` (an MQTT persistent session's) is kept by its owner instead, which
makes it again on start: it is left out of ``queues.log``, whose fsynced appends (on the event loop)
a client changing its subscriptions could otherwise repeat at will.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from meshplane.core.mesh.source_marks import SourceMarks
from meshplane.core.mesh.vpn import DEFAULT, outward, prefix_of, queue_topic, vpn_of
from meshplane.core.subjects import is_reserved, valid_pattern
from meshplane.mesh import queue_items
from meshplane.mesh.queue_items import Queue
from meshplane.mesh.queue_journal import QueueJournal
from meshplane.streams.errors import (
    BadRequest,
    Conflict,
    CorruptRecords,
    Forbidden,
    LimitReached,
    NotFound,
    StorageError,
    StreamError,
)
from meshplane.streams.files import sync_replaced, write_atomic

if TYPE_CHECKING:
    from meshplane.core.mesh.permissions import Permissions
    from meshplane.mesh.node import MeshNode
    from meshplane.streams.service import StreamsService
    from meshplane.streams.topics import Topic

log = logging.getLogger(__name__)

PREFIX = "$G."  # a queue's pattern travels as this + the pattern; guaranteed events are routed so too
RECALLED = "\x00recalled"  # the way of the ids read back on start (no node id holds a NUL)
MAX_PATTERNS_PER_QUEUE = 100


class QueueUser(Protocol):
    """Who asks for a queue: a client logged in as a VPN's user (``permissions`` None: as none)."""

    @property
    def vpn(self) -> str: ...

    @property
    def user(self) -> str: ...

    @property
    def permissions(self) -> Permissions | None: ...


class Queues:
    """The queues of one node."""

    def __init__(self, node: MeshNode) -> None:
        self.node = node
        self.engine: StreamsService | None = None
        self._root = Path()
        self.queues: dict[str, Queue] = {}
        self.unsaved: set[str] = set()  # queues their owner keeps (not in queues.log)
        self._journal: QueueJournal | None = None
        self._counts: Counter[str] = Counter()  # queues by VPN
        self._making: dict[str, asyncio.Future[None]] = {}  # queues being made (:meth:`make`), by name
        self._making_vpn: dict[str, str] = {}  # ... their VPN if new, else ""

    def open(self, engine: StreamsService, root: Path) -> None:
        """Load the queues and subscribe them (so they are advertised from the first link on)."""
        self.engine, self._root = engine, root
        self.close()
        self._journal = QueueJournal(root)
        try:
            saved = self._journal.load()
        except OSError as exc:
            raise StorageError(f"{root}: the queues are unreadable ({exc})") from exc
        for name, patterns in saved.items():
            self._install(name, patterns)
        try:
            paused = msgspec.json.decode((root / "paused.json").read_bytes(), type=list[str])
        except FileNotFoundError:
            paused = []
        except (OSError, msgspec.DecodeError) as exc:
            raise StorageError(f"{root / 'paused.json'}: unreadable ({exc})") from exc
        for name in paused:
            if name in self.queues:
                self._pause(name, True)

    def pause(self, name: str, paused: bool = True) -> Queue:
        """Pause (or resume) a queue: it keeps storing what it is sent, and its topic's readers get
        nothing until it is resumed. Saved before it applies, so a restart keeps it paused."""
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"queue {name!r} not found")
        names = {q.name for q in self.queues.values() if q.paused}
        names = names | {name} if paused else names - {name}
        try:
            write_atomic(self._root / "paused.json", msgspec.json.encode(sorted(names)))
        except OSError as exc:
            raise StorageError(f"saving the paused queues: {exc}") from exc
        self._pause(name, paused)
        return queue

    def _pause(self, name: str, paused: bool) -> None:
        assert self.engine is not None
        self.queues[name].paused = paused
        topic = self.engine.topic_store.topics.get(name)
        if topic is not None:
            topic.held = paused

    def create(
        self,
        name: str,
        patterns: list[str],
        vpn: str = DEFAULT,
        who: QueueUser | None = None,
        *,
        saved: bool = True,
    ) -> Queue:
        """Make (or change the patterns of) a queue of ``vpn`` and its topic; persisted before it is
        advertised (but with ``saved=False``: its owner keeps it, see the module). ``who``: the VPN
        user asking, held to its queue permissions (Forbidden, counted as its violation: create for a
        new queue, bind for its patterns)."""
        name, checked = self._checked(name, patterns, vpn, who)
        self._topic(name, vpn, sync=True)
        if saved:
            self._save(name, checked)
            self.unsaved.discard(name)
        else:
            if name in self.queues and name not in self.unsaved:  # saved before: taken out of the log
                self._save(name, [])
            self.unsaved.add(name)
        return self._replace(name, checked)

    async def make(
        self, name: str, patterns: list[str], vpn: str = DEFAULT, who: QueueUser | None = None
    ) -> Queue:
        """:meth:`create` (saved) without blocking the event loop: the topic's fsyncs and the journal's
        (one shared by the queues made meanwhile) in worker threads, all at once; returns once all are
        durable. Changes of one queue wait for each other; those of others overlap."""
        while (busy := self._making.get(queue_topic(vpn, name))) is not None:
            await asyncio.wait([busy])  # its outcome is its caller's
        name, checked = self._checked(name, patterns, vpn, who)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._making[name] = done
        self._making_vpn[name] = vpn if name not in self.queues else ""
        try:
            topic = self._topic(name, vpn, sync=False)
            synced = sync_replaced(topic / "topic.json") if topic is not None else asyncio.sleep(0)
            results = await asyncio.gather(synced, self._commit(name, checked), return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            recorded = results[1]
            if isinstance(recorded, int):
                assert self._journal is not None
                self._journal.applied(recorded)  # applied below, or undone
            if failed is not None:
                if isinstance(recorded, int):  # recorded, its topic not durable: undone
                    old = self.queues.get(name)
                    with contextlib.suppress(StorageError):
                        self._save(name, old.patterns if old is not None and name not in self.unsaved else [])
                if isinstance(failed, StorageError):
                    raise failed
                raise StorageError(f"making queue {name!r}: {failed}") from failed
            self.unsaved.discard(name)
            return self._replace(name, checked)
        finally:
            del self._making[name], self._making_vpn[name]
            done.set_result(None)

    def _checked(
        self, name: str, patterns: list[str], vpn: str, who: QueueUser | None
    ) -> tuple[str, list[str]]:
        """The queue's stored name and its patterns (with the VPN's prefix, sorted, once each), or why
        it may not be made."""
        if self.engine is None:
            raise BadRequest("this mesh node has no streams data directory: it keeps no queues")
        if vpn not in self.node.config.vpns:
            raise BadRequest(f"no Message VPN {vpn[:40]!r} on this node")
        known = self.queues.get(name)
        if ":" in name and (
            known is None or vpn != DEFAULT or vpn_of("".join(known.patterns[:1])) != DEFAULT
        ):
            # Only an older default-VPN queue keeps such a name: a VPN's is stored as "VPN:name", and
            # would be taken over, its events the default VPN's from then on.
            raise BadRequest(f"queue {name[:80]!r}: ':' separates a queue's VPN from its name")
        prefix, queue_name, name = prefix_of(vpn), name, queue_topic(vpn, name)
        checked = []
        for pattern in patterns:
            valid = valid_pattern(pattern)
            if valid is None or is_reserved(valid) or valid_pattern(PREFIX + prefix + valid) is None:
                raise BadRequest(f"queue pattern {pattern!r}: not a valid pattern")
            checked.append(prefix + valid)
        if not 1 <= len(checked) <= MAX_PATTERNS_PER_QUEUE:
            raise BadRequest(f"a queue takes 1-{MAX_PATTERNS_PER_QUEUE} patterns")
        if who is not None:
            self.allowed(who, "create" if name not in self.queues else "bind", queue_name, tuple(patterns))
        if name not in self.queues:  # a new one: within the bounds, those being made counted too
            if len(self.queues) + self._new_being_made("") >= self.limit:
                raise LimitReached(
                    f"{self.limit} queues on this node (its limit: --mesh-max-queues)", "queues"
                )
            limit = self.node.config.vpns[vpn].max_queues
            if limit is not None and self._count(vpn) + self._new_being_made(vpn) >= limit:
                self.node.logins.limits_refused[(vpn, "queues")] += 1
                raise LimitReached(f"Message VPN {vpn!r}: {limit} queues on this node (its limit)", "queues")
        return name, sorted(set(checked))

    def _new_being_made(self, vpn: str) -> int:
        """New queues being made (of ``vpn``; "": of any)."""
        return sum(1 for v in self._making_vpn.values() if v and (not vpn or v == vpn))

    def _topic(self, name: str, vpn: str, *, sync: bool) -> Path | None:
        """The queue's topic, made if it has none (new, or deleted under the queue: held if it is
        paused); its directory when made. A named VPN's is outside the streams' topic limits (its VPN's
        queue limits bound it), so one tenant's queues never use up the default VPN's topics."""
        assert self.engine is not None
        if vpn != DEFAULT:
            self.engine.topic_store.exempt.add(name)
        if name in self.engine.topics:
            return None
        old_queue = self.queues.get(name)
        topic = self.engine.topic_store.create(name, 1, sync=sync)
        topic.held = old_queue is not None and old_queue.paused
        return topic.directory

    def _replace(self, name: str, patterns: list[str]) -> Queue:
        old = self.queues.pop(name, None)
        if old is not None:
            self._counts[vpn_of(old.patterns[0])] -= 1
            self._withdraw(old)
        return self._install(name, patterns, old)

    def allowed(self, who: QueueUser, action: str, name: str, patterns: tuple[str, ...] = ()) -> None:
        """Forbidden (counted as ``who``'s violation) unless its permissions allow ``action`` on its
        VPN's queue ``name`` (create binds too: its ``patterns``, as its VPN's clients write them)."""
        permissions = who.permissions
        if permissions is None:  # no user: a VPN without users, or an administrator's call
            return
        actions = ("create", "bind") if action == "create" else (action,)
        refused = next(filter(None, (permissions.why_not_queue(a, name, patterns) for a in actions)), "")
        if refused:
            self.node.logins.violations[(who.vpn, who.user)] += 1
            raise Forbidden(refused)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    @property
    def limit(self) -> int:
        """The most queues this node keeps."""
        return self.node.config.max_queues

    def _count(self, vpn: str) -> int:
        return self._counts[vpn]

    def delete(self, name: str, vpn: str = DEFAULT) -> bool:
        """Stop the queue's interest (its topic and what it holds stay, to be read or deleted)."""
        queue = self.queues.get(queue_topic(vpn, name))
        if queue is None:
            return False
        if queue.name in self._making:  # its line would come after the change's, applied before it
            raise Conflict(f"queue {name[:80]!r} is being changed: delete it once that is answered")
        if queue.paused:  # its topic stays, readable: a queue made again under the name starts resumed
            self.pause(queue.name, False)
        if queue.name in self.unsaved:
            self.unsaved.discard(queue.name)
        else:
            self._save(queue.name, [])
        del self.queues[queue.name]
        self._counts[vpn_of(queue.patterns[0])] -= 1
        self._withdraw(queue)
        return True

    def _withdraw(self, queue: Queue) -> None:
        for pattern in queue.patterns:
            self.node.unsubscribe(queue, PREFIX + pattern)
        self.node.gateways.queues_changed((), queue.patterns)

    def _save(self, name: str, patterns: list[str]) -> None:
        """Record a queue's patterns (none: deleted) before they apply."""
        assert self._journal is not None
        try:
            self._journal.put(name, patterns, self._after(name, patterns), len(self.queues))
        except OSError as exc:
            raise StorageError(f"saving the queues: {exc}") from exc

    def _after(self, name: str, patterns: list[str]) -> Callable[[], dict[str, list[str]]]:
        def after() -> dict[str, list[str]]:  # every queue once it applies (asked for to compact)
            state = {
                q.name: q.patterns
                for q in self.queues.values()
                if q.name != name and q.name not in self.unsaved
            }
            return state | {name: patterns} if patterns else state

        return after

    async def _commit(self, name: str, patterns: list[str]) -> int:
        """:meth:`_save` for :meth:`make`: the fsync shared, in a worker thread; the line's number."""
        assert self._journal is not None
        try:
            return await self._journal.commit(name, patterns, self._after(name, patterns), len(self.queues))
        except OSError as exc:
            raise StorageError(f"saving the queues: {exc}") from exc

    def _install(self, name: str, patterns: list[str], old: Queue | None = None) -> Queue:
        queue = Queue(name, patterns)
        if old is not None:
            queue.recent, queue.marks, queue.paused = old.recent, old.marks, old.paused
        else:
            self._recall(queue)
        self.queues[name] = queue
        self._counts[vpn := vpn_of(patterns[0])] += 1
        if vpn != DEFAULT and self.engine is not None:  # see _topic
            self.engine.topic_store.exempt.add(name)
        for pattern in patterns:
            self.node.subscribe(queue, PREFIX + pattern)
        self.node.gateways.queues_changed(patterns, ())  # other clusters are told of it too
        return queue

    def _recall(self, queue: Queue) -> None:
        """What a resend may repeat, from the queue's topic: the ids of its last events (of this node's
        publishers, the last RECENT_IDS of theirs, from where the checkpoint says the oldest is) and
        the last offset stored from each spool (the checkpoint, then the events stored after it; all
        of them without one: the first start with marks, or a checkpoint newer than the topic)."""
        assert self.engine is not None
        topic = self.engine.topic_store.topics.get(queue.name)
        if topic is None:
            self.engine.topic_store.create(queue.name, 1)
            return
        partition = topic.partitions[0]
        start: int | None = None
        with contextlib.suppress(OSError):
            start = queue.marks.load(self._marks_path(queue.name).read_bytes(), partition.next_offset)
        if start is None:
            queue.marks = SourceMarks()
        marks_from = max(partition.start_offset, start or 0)
        local = queue.marks.local_from
        local_from = marks_from if local is None else max(partition.start_offset, min(local, marks_from))
        window = max(partition.start_offset, partition.next_offset - queue_items.RECENT_IDS)  # every way's
        offset = min(marks_from, local_from, window)
        while offset < partition.next_offset:
            try:
                events = topic.read(0, offset, 1000, counted=False)
            except (CorruptRecords, StreamError) as exc:
                log.warning("queue %s: could not read back what it stored last (%s)", queue.name, exc)
                break
            if not events:
                break
            mine: dict[str, int] = {}  # this node's publishers': id, its offset
            recalled: dict[str, None] = {}
            for event in events:
                metadata = event.body.metadata or {}
                via, event_id = metadata.get("via"), event.body.id
                if via and event.offset >= marks_from:
                    with contextlib.suppress(ValueError):
                        queue.marks.stored(via, int(metadata.get("via_offset", "")), event.timestamp_ms)
                if event_id in queue.recent.ids or event_id in mine or event_id in recalled:
                    continue
                if not via and event.offset >= local_from:
                    mine[event_id] = event.offset
                elif event.offset >= window:
                    recalled[event_id] = None
            queue.recent.remember(mine, "", mine.values())
            queue.recent.remember(recalled, RECALLED)
            offset = events[-1].offset + 1
        for index, other in enumerate(topic.partitions[1:], 1):  # a topic made before its queue
            self._recall_ids(
                queue, topic, index, max(other.start_offset, other.next_offset - queue_items.RECENT_IDS)
            )

    def _recall_ids(self, queue: Queue, topic: Topic, index: int, offset: int) -> None:
        """The ids a partition holds from ``offset`` on."""
        while offset < topic.partitions[index].next_offset:
            try:
                events = topic.read(index, offset, 1000, counted=False)
            except (CorruptRecords, StreamError) as exc:
                log.warning("queue %s: could not read back its recent ids (%s)", queue.name, exc)
                return
            if not events:
                return
            new = dict.fromkeys(event.body.id for event in events)
            queue.recent.remember([i for i in new if i not in queue.recent.ids], RECALLED)
            offset = events[-1].offset + 1

    def _marks_path(self, name: str) -> Path:
        return self._root / "queue-marks" / f"{name.encode().hex()}.json"

    def save_marks(self) -> None:
        """Checkpoint each queue's spool offsets and where its publishers' oldest remembered id is,
        when either changed (not synced: one lost or newer than the topic after a power loss is
        rebuilt from the topic)."""
        assert self.engine is not None
        for queue in self.queues.values():
            topic = self.engine.topic_store.topics.get(queue.name)
            local_from = queue.recent.local_from
            if topic is None or not (queue.marks.changed or local_from != queue.marks.local_from):
                continue
            path = self._marks_path(queue.name)
            try:
                path.parent.mkdir(exist_ok=True)
                saved = queue.marks.encode(topic.partitions[0].next_offset, local_from)
                write_atomic(path, saved, sync=False)
                queue.marks.changed = False
            except OSError as exc:
                log.warning("queue %s: could not checkpoint its spool offsets (%s)", queue.name, exc)

    def status(self) -> list[dict[str, Any]]:
        return [queue_status(q) for q in sorted(self.queues.values(), key=lambda q: q.name)]


def queue_status(queue: Queue) -> dict[str, Any]:
    """A queue as ``GET /mesh`` shows it: ``name`` is its topic's; its patterns as its VPN's clients
    write them."""
    vpn = vpn_of(queue.patterns[0]) if queue.patterns else DEFAULT
    return {
        "name": queue.name,
        "vpn": vpn,
        "patterns": [outward(prefix_of(vpn), p) for p in queue.patterns],
        "stored": queue.stored,
        "duplicates": queue.duplicates,
        "paused": queue.paused,
    }
