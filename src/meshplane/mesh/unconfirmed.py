"""A mesh client's guaranteed publishes awaiting their ACK, in the order they were sent.

At most ``limit`` at once (a publisher waits for room, first come first served), and each one failed
when its timeout passes, by one timer for all of them: the publishes share one timeout, so the oldest
is always the first to expire. (A timer per publish, or ``asyncio.Semaphore``, whose ``acquire``
builds a generator over its waiters every time in Python 3.11, cost more than the publish itself.)
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from meshplane.core.mesh.frames import ANSWER_UNKNOWN, restamp
from meshplane.core.mesh.permissions import DENIED
from meshplane.errors import PermissionDenied, TransportError


@dataclass(slots=True)
class _Entry:
    raw: bytes
    answer: asyncio.Future[None]
    deadline: float
    subject: str
    timeout: float
    reason: str = ""  # the last answer that said the outcome is unknown


class Unconfirmed:
    def __init__(self, limit: int, node_url: str) -> None:
        self.limit = limit
        self.node_url = node_url
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._room: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._entries)

    async def room(self) -> None:
        """Return once one more publish may be sent (at once while fewer than ``limit`` wait)."""
        while len(self._entries) >= self.limit or self._room:
            waiter = asyncio.get_running_loop().create_future()
            self._room.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._room:
                    self._room.remove(waiter)
                else:
                    self._make_room()  # woken, then cancelled: the room goes to the next
                raise
            if len(self._entries) < self.limit:
                return

    def add(self, sequence: int, raw: bytes, subject: str, timeout: float) -> asyncio.Future[None]:
        """The publish ``sequence`` was sent: its answer, done once stored, failed with TransportError
        when the node refused it or ``timeout`` passed without an answer."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[None] = loop.create_future()
        deadline = loop.time() + timeout
        self._entries[sequence] = _Entry(raw, answer, deadline, subject, timeout)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        return answer

    def confirm(self, sequence: int, error: str) -> bytes | None:
        """The node's answer to ``sequence``: "" when stored, else why not. One that says the outcome
        is unknown (ANSWER_UNKNOWN) keeps the publish waiting: its frame is returned, to be sent again
        as it is (the same event id), until it is answered or times out."""
        if error.startswith(ANSWER_UNKNOWN):
            unknown = self._entries.get(sequence)
            if unknown is not None and not unknown.answer.done():
                unknown.reason = error
                return unknown.raw
            return None
        entry = self._entries.pop(sequence, None)
        if entry is not None:
            if entry.answer.done():
                pass
            elif error.startswith(DENIED):  # the user's permissions: sending it again changes nothing
                entry.answer.set_exception(PermissionDenied(error))
            elif error:
                entry.answer.set_exception(
                    TransportError(f"the mesh node at {self.node_url} did not store the event: {error}")
                )
            else:
                entry.answer.set_result(None)
            self._make_room()
        return None

    def confirm_stored(self, sequences: Iterable[int]) -> None:
        """The node stored each of ``sequences`` (a batched ACK)."""
        entries = self._entries
        for sequence in sequences:
            entry = entries.pop(sequence, None)
            if entry is not None and not entry.answer.done():
                entry.answer.set_result(None)
        self._make_room()

    def waiting(self, sequence: int) -> bytes | None:
        """The frame of ``sequence`` if it still waits for its answer."""
        entry = self._entries.get(sequence)
        return entry.raw if entry is not None and not entry.answer.done() else None

    def raws(self, origin: str) -> list[bytes]:
        """What to send again on a new connection, oldest first, with its ``origin`` (a node that did not
        let the client keep its origin gets them under the new one: their ids change)."""
        entries = self._entries.values()
        for entry in entries:
            if entry.raw[2 : 2 + len(origin)] != origin.encode():
                entry.raw = restamp(entry.raw, origin)
        return [entry.raw for entry in entries]

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer, now = None, loop.time()
        while self._entries:
            entry = next(iter(self._entries.values()))
            if entry.deadline > now and not entry.answer.done():
                self._timer = loop.call_at(entry.deadline, self._expire)
                break
            self._entries.popitem(last=False)
            if not entry.answer.done():
                why = f" (last answer: {entry.reason})" if entry.reason else ""
                entry.answer.set_exception(
                    TransportError(
                        f"the mesh node at {self.node_url} did not confirm a guaranteed event on "
                        f"{entry.subject!r} within {entry.timeout}s: it may or may not have been "
                        f"stored{why}"
                    )
                )
            self._make_room()

    def _make_room(self) -> None:
        while self._room and len(self._entries) < self.limit:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
