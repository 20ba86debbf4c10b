"""Waiting on a ZeroMQ socket from asyncio: sleeping on its notification descriptor, or spinning."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import types

import zmq
import zmq.backend

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_LOOP_TURN = 0.001  # seconds a busy-polling subscriber spins before the loop's other tasks get a turn


class Readable:
    """Lets a coroutine wait until a ZeroMQ socket has a message to read.

    ZeroMQ signals through ``ZMQ_FD`` only when its state changes, and reading ``ZMQ_EVENTS`` is what
    processes pending commands and re-arms the signal; so the loop's reader callback reads it every
    time, and ``wait`` checks it before sleeping.

    With ``busy_poll`` seconds, ``wait`` first keeps asking for that long, giving the loop's other tasks
    and the machine's other threads their turn between asks, before it sleeps: a message that comes
    meanwhile costs no wake-up of the loop (lower latency, at the price of a core while it spins).
    """

    def __init__(self, sock: zmq.Socket[bytes], busy_poll: float = 0.0) -> None:
        self._sock = sock
        self._busy_poll = busy_poll
        self._closed = False
        # The compiled getsockopt, asked with plain ints: the enum flags' Python operators cost more
        # than the call.
        self._get = types.MethodType(zmq.backend.Socket.get, sock)
        self._loop = asyncio.get_running_loop()
        self._fd = int(sock.getsockopt(zmq.FD))
        self._waiter: asyncio.Future[None] | None = None
        self._loop.add_reader(self._fd, self._on_signal)

    def _on_signal(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.poll()

    def poll(self) -> bool:
        """``readable()`` for anyone but ``wait``: reading ``ZMQ_EVENTS`` consumes the signal ``wait``
        sleeps on, so a message found here wakes it (else it would sleep with the message waiting)."""
        readable = self.readable()
        if readable:
            self.wake()
        return readable

    def wake(self) -> None:
        """Let a sleeping ``wait`` return (its caller looks again)."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def readable(self) -> bool:
        """Whether a message waits (reads ``ZMQ_EVENTS``: a system call, ~1 us; EAGAIN costs ~3 us)."""
        return bool(self._get(_EVENTS) & _POLLIN)

    async def wait(self) -> None:
        """Until the socket has a message.

        ``ZMQ_EVENTS`` is read before sleeping even right after an EAGAIN: skipping that read (it
        costs ~1 us) made libzmq abort on ``!_more`` in fq.cpp under high-water-mark pressure."""
        if self.readable():
            return
        if self._busy_poll:
            now = turn = time.monotonic()
            deadline = now + self._busy_poll
            while now < deadline:
                os.sched_yield()  # this core's other threads (a publisher, ZeroMQ's I/O thread) go first
                if now - turn >= _LOOP_TURN:  # and the loop's other tasks, now and then: a turn of the
                    turn = now  # loop costs a message that comes meanwhile ~10 us
                    await asyncio.sleep(0)
                if self._closed or self.readable():
                    return
                now = time.monotonic()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self._closed = True
        self._loop.remove_reader(self._fd)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()
