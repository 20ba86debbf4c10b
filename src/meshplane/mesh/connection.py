"""One TCP connection carrying mesh frames: a :class:`~meshplane.core.mesh.frames.FrameReader` on
the way in, batched writes on the way out (seed 004's ``message_batch_size`` and
``message_batch_timeout_ms``), and the transport's flow control reported as ``paused``.

Until :meth:`FrameConnection.seal` the connection reads handshake frames only (HELLO and AUTH, one at a
time, each at most ``HANDSHAKE_FRAME_BYTES``); from then on every byte either way travels in the
session's records (:mod:`.session`), and one that does not open closes the connection."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from meshplane.core.mesh.frames import (
    Frame,
    FrameError,
    FrameReader,
    FrameType,
    handshake_frame_length,
)
from meshplane.mesh.session import Opener, Sealer, SessionError, SessionKeys

log = logging.getLogger(__name__)


class Batch(Protocol):
    """Items sent as one frame (:meth:`FrameConnection.send_batched`)."""

    @property
    def full(self) -> bool: ...

    def add(self, item: Any) -> None: ...

    def encode(self) -> bytes: ...


WRITE_HIGH_WATER = 1024 * 1024
TURN_SECONDS = 0.005  # frames handled in one go, at most this long, before others get a turn


@dataclass
class PartialBytes:
    """Bytes of frames not yet whole, across a node's connections: one budget, so that many peers
    each sending part of a large frame cannot together hold the node's memory."""

    limit: int
    used: int = 0
    peak: int = 0  # the most held at once


@dataclass
class ConnectionStats:
    bytes_in: int = 0
    bytes_out: int = 0
    frames_in: int = 0
    frames_out: int = 0
    batches_out: int = 0
    bad_frames: int = 0


class FrameConnection(asyncio.Protocol):
    """Frames in through ``on_frame``; ``send`` queues a frame for the next batch.

    ``on_bad`` hears of every dropped frame; a fatal one (lengths beyond the limits) closes the
    connection, as nothing after it can be trusted."""

    def __init__(
        self,
        *,
        max_payload: int,
        batch_size: int,
        batch_timeout_ms: float,
        on_frame: Callable[[FrameConnection, Frame], None],
        on_bad: Callable[[FrameConnection, FrameError], None],
        on_close: Callable[[FrameConnection], None],
        on_open: Callable[[FrameConnection], None] | None = None,
        on_resume: Callable[[FrameConnection], None] | None = None,
        on_eof: Callable[[FrameConnection], bool] | None = None,
        on_limit: Callable[[FrameConnection, str], None] | None = None,
        max_pending_bytes: int = 0,
        partial: PartialBytes | None = None,
    ) -> None:
        self.reader = FrameReader(max_payload)
        self.batch_size = max(1, batch_size)
        self.batch_delay = batch_timeout_ms / 1000
        self.stats = ConnectionStats()
        self.transport: asyncio.Transport | None = None
        self.paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self.closed = asyncio.get_running_loop().create_future()
        self.peer = ""  # who is at the other end, once known
        self._on_frame = on_frame
        self._on_bad = on_bad
        self._on_close = on_close
        self._on_open = on_open
        self._on_resume = on_resume
        self._on_eof = on_eof
        self._on_limit = on_limit
        self.max_pending_bytes = max_pending_bytes  # 0: no limit
        self._partial = partial
        self._partial_counted = 0  # this connection's share of ``partial.used``
        self.last_received = time.monotonic()
        self.partial_since: float | None = None  # when the frame not yet whole began to arrive
        self.peer_done = False
        self._backlog: list[Frame | FrameError] = []
        self._reading_paused = False
        self._held = False  # ``hold``: what was read waits, and nothing more is read
        self._eof_waiting = False
        self._closing = False
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._batch: Batch | None = None  # the batch frame being filled, after everything in _pending
        self._flush_handle: asyncio.Handle | None = None
        self._handshake_bytes = b""  # a handshake frame not yet whole (before ``seal``)
        self._sealer: Sealer | None = None
        self._opener: Opener | None = None
        self._on_confirmed: Callable[[FrameConnection], None] | None = None
        # The node's direct path for what this connection reads (``direct_path``): the frames it takes
        # from the start of a read are handled before the rest is read as frames.
        self.direct: Callable[[bytes, int], int] | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        self.stats.bytes_in += len(data)
        self.last_received = time.monotonic()
        if self._opener is None:
            self._handshake_received(data)
        else:
            self._sealed_received(data)

    def _handshake_received(self, data: bytes) -> None:
        """HELLO and AUTH, one frame at a time: the one that completes the handshake seals the
        connection, and what follows it is read as records."""
        buffer = self._handshake_bytes + data
        while True:
            try:
                length = handshake_frame_length(buffer)
            except ValueError:
                return self.limit("hello_too_large")
            if length is None:
                self._handshake_bytes = buffer
                return
            items, buffer = self.reader.feed(buffer[:length]), buffer[length:]
            item = items[0] if items else None
            if not isinstance(item, Frame) or item.type not in (FrameType.HELLO, FrameType.AUTH):
                return self.limit("before_auth")
            self.stats.frames_in += 1
            self._on_frame(self, item)
            if self._closing or self.transport is None:
                return
            if self._opener is not None:
                self._handshake_bytes = b""
                if buffer:
                    self._sealed_received(buffer)
                return

    def _sealed_received(self, data: bytes) -> None:
        assert self._opener is not None
        try:
            data = self._opener.feed(data)
        except SessionError:
            return self.limit("bad_record")
        if self._on_confirmed is not None and self._opener.opened:
            confirmed, self._on_confirmed = self._on_confirmed, None
            confirmed(self)  # the dialler holds the session's keys: its link may be installed now
            if self._closing or self.transport is None:
                return
        if data:
            self._frames_received(data)
        elif self._partial is not None:
            self._count_partial()
        if self._opener.pending and self.partial_since is None:
            self.partial_since = self.last_received  # a record begun must be finished in time too

    def _frames_received(self, data: bytes) -> None:
        now = self.last_received
        # Only with nothing waiting from before: what it takes is handled at once, in order.
        direct = self.direct if not self._backlog and not self._held else None
        items = self.reader.feed(data, direct)
        if not self.reader.pending:
            self.partial_since = None
        elif items or self.partial_since is None:
            self.partial_since = now  # a frame completed here: the one pending began here too
        if self._partial is not None and self._count_partial():
            return
        self._backlog = self._backlog + items if self._backlog else items
        self._handle_backlog()

    def _count_partial(self) -> bool:
        """True when this connection's half frame was one too many for the node (it is closed)."""
        assert self._partial is not None
        pending = self.reader.pending + (self._opener.pending if self._opener is not None else 0)
        self._partial.used += pending - self._partial_counted
        self._partial.peak = max(self._partial.peak, self._partial.used)
        self._partial_counted = pending
        if self._partial.used > self._partial.limit and pending > self._partial.limit // 64:
            self.limit("partial_bytes")  # the largest holders go first; small frames pass
            return True
        return False

    def _handle_backlog(self) -> None:
        """Hand over what was read, a turn at a time: one read can hold thousands of frames, and
        every other connection (``/health`` included) waits while they are handled. Reading stops
        until the backlog is done, so the peer feels it as TCP backpressure."""
        if self._closing:  # what was read and not yet handled is dropped
            return
        items, self._backlog = self._backlog, []
        deadline = time.perf_counter() + TURN_SECONDS
        on_frame, stats = self._on_frame, self.stats
        for index, item in enumerate(items):
            if self._held:
                self._backlog = items[index:]
                self._pause_reading()
                return
            if type(item) is Frame:  # the one hot path of every connection: the rest in _hand_over
                stats.frames_in += 1
                on_frame(self, item)
            elif not self._hand_over(item):
                return
            if self._closing or self.transport is None:  # closed by what it handed over
                return
            if index & 31 == 31 and index + 1 < len(items) and time.perf_counter() > deadline:
                self._backlog = items[index + 1 :]
                self._pause_reading()
                asyncio.get_running_loop().call_soon(self._handle_backlog)
                return
        if self._held:
            self._pause_reading()
            return
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        if self._eof_waiting:  # the peer's end, once everything it sent before it is handled
            self._eof_waiting = False
            if not self._end_of_input():
                self.close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def hold(self) -> None:
        """Hand over nothing more until ``release``: the frames read wait, and the peer feels TCP
        backpressure for the rest."""
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            asyncio.get_running_loop().call_soon(self._handle_backlog)

    def _hand_over(self, item: Frame | FrameError) -> bool:
        """False once the stream is lost (a fatal error: the connection is closed)."""
        if isinstance(item, FrameError):
            self.stats.bad_frames += 1
            self._on_bad(self, item)
            if item.fatal:
                self.close()
                return False
        else:
            self.stats.frames_in += 1
            self._on_frame(self, item)
        return True

    def eof_received(self) -> bool:
        """The peer is done sending. Its retired connection: close. A connection still in use here
        (the peer switched first): keep sending until this side switches too (``on_eof`` says)."""
        if self._backlog:
            self._eof_waiting = True
            return True
        return self._end_of_input()

    def _end_of_input(self) -> bool:
        self.peer_done = True
        return self._on_eof is not None and self._on_eof(self)

    def pause_writing(self) -> None:
        self.paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.paused = False
        self._writable.set()
        if self._on_resume is not None:
            self._on_resume(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._partial is not None:
            self._partial.used -= self._partial_counted
            self._partial_counted = 0
        items, self._backlog = self._backlog, []
        for item in items if not self._closing else ():  # the peer's last frames before its end
            if not self._hand_over(item):
                break
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._pending.clear()
        self._pending_bytes = 0
        self._batch = None
        self.transport = None
        self._writable.set()
        if not self.closed.done():
            self.closed.set_result(None)
        self._on_close(self)

    # --- the session -----------------------------------------------------------------------------------

    def seal(
        self,
        keys: SessionKeys,
        *,
        dialler: bool,
        on_confirmed: Callable[[FrameConnection], None] | None = None,
    ) -> None:
        """Both proofs are in: from now on every byte either way is in the session's records. The
        dialler confirms at once (an empty record); the node hears of it through ``on_confirmed``."""
        self.flush()  # the handshake's last frame goes in clear
        self._sealer, self._opener = keys.sealer(dialler), keys.opener(dialler)
        if dialler and self.transport is not None:
            confirmation = self._sealer.seal(b"")
            self.stats.bytes_out += len(confirmation)
            self.transport.write(confirmation)
        self._on_confirmed = on_confirmed

    # --- writing -------------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def buffered_bytes(self) -> int:
        written = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return self._pending_bytes + written

    def send(self, frame: bytes) -> None:
        if self._batch is not None:
            self._close_batch()
        if self.transport is None:
            return
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        self.stats.frames_out += 1
        if self.max_pending_bytes and self._pending_bytes > self.max_pending_bytes:
            self.limit("slow_peer")  # before the transport's own buffer grows without bound
            return
        if len(self._pending) >= self.batch_size:
            self.flush()
        else:
            self._schedule_flush()

    def send_batched(self, item: Any, batch: Callable[[], Batch]) -> None:
        """Send ``item`` in the batch frame being filled at the end of what is queued, or in a new one
        (``batch()``) once anything else was sent since or it is full: frames keep the order they were
        sent in, and a burst of items costs a peer one frame, not one each."""
        if self.transport is None:
            return
        current = self._batch
        if current is None or current.full:
            if current is not None:
                self._close_batch()
            current = self._batch = batch()
            self._schedule_flush()
        current.add(item)

    def _close_batch(self) -> None:
        current, self._batch = self._batch, None
        if current is not None:
            self.send(current.encode())

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = (
                loop.call_later(self.batch_delay, self.flush)
                if self.batch_delay
                else loop.call_soon(self.flush)
            )

    def send_many(self, frames: list[bytes]) -> None:
        """:meth:`send` of each, at once."""
        if frames:
            self.send(b"".join(frames))
            self.stats.frames_out += len(frames) - 1

    def flush(self) -> None:
        if self._batch is not None:
            self._close_batch()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._pending or self.transport is None:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if self._sealer is not None:
            data = self._sealer.seal(data)
        self.stats.bytes_out += len(data)
        self.stats.batches_out += 1
        self.transport.write(data)
        if self.max_pending_bytes and self.transport.get_write_buffer_size() > self.max_pending_bytes:
            self.limit("slow_peer")

    def limit(self, reason: str) -> None:
        """This connection passed a limit: told once, then closed without what it had queued."""
        transport, self.transport = self.transport, None
        if transport is None:
            return
        self._closing = True
        self._pending.clear()
        self._pending_bytes = 0
        self._batch = None
        if self._on_limit is not None:
            self._on_limit(self, reason)
        transport.abort()

    async def drain(self) -> None:
        """Wait while the socket pushes back (the transport's buffer is above its high-water mark)."""
        if self.paused:
            await self._writable.wait()

    def retire(self, grace: float = 5.0) -> None:
        """Stop sending (after what is queued) but read on until the peer stops too: what it sent
        before it switched connections still arrives. Closed outright after ``grace`` seconds."""
        self.flush()
        transport = self.transport
        if transport is None:
            return
        if self.peer_done or not transport.can_write_eof():
            self.close()  # the peer has switched already: nothing more will come
            return
        transport.write_eof()
        asyncio.get_running_loop().call_later(grace, self.close)

    def close(self) -> None:
        self._closing = True  # what was read and not yet handled is dropped
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def check_deadlines(self, now: float, frame_timeout: float, idle_timeout: float) -> None:
        """Close a connection whose frame has been arriving too long, or that has sent nothing."""
        if self.partial_since is not None and now - self.partial_since > frame_timeout:
            self.limit("slow_frame")
        elif idle_timeout and now - self.last_received > idle_timeout:
            self.limit("idle")


def close_peer(conn: FrameConnection | None, reason: str) -> None:
    """A connection that passed a limit or broke the protocol: closed and counted (its ``on_limit``);
    nobody else notices."""
    if conn is not None:
        conn.limit(reason)
