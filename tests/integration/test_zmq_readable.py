"""``Readable``, the asyncio wait on a ZeroMQ socket, on real sockets: anyone reading ``ZMQ_EVENTS`` while
it sleeps (the liveness watch asks whether messages wait) consumes the signal it sleeps on."""

from __future__ import annotations

import asyncio
import time

import zmq

from meshplane.transports.zmq_readable import Readable


async def test_a_poll_that_finds_a_message_wakes_a_sleeping_wait() -> None:
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        readable = Readable(pull)
        waiting = asyncio.create_task(readable.wait())
        await asyncio.sleep(0.01)  # asleep on the socket's signal
        assert not waiting.done()
        push.send(b"event")
        # Without yielding to the loop: this read of ZMQ_EVENTS takes the signal before the loop sees it.
        deadline = time.monotonic() + 5
        while not readable.poll():
            assert time.monotonic() < deadline, "the message never arrived"
        await asyncio.wait_for(waiting, 2)  # woken by the poll: the loop alone would never see the signal
        assert pull.recv(zmq.NOBLOCK) == b"event"
        readable.close()
    finally:
        push.close(0)
        pull.close(0)
        context.term()


async def test_wake_lets_a_sleeping_wait_return_with_nothing_to_read() -> None:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    try:
        pull.bind_to_random_port("tcp://127.0.0.1")
        readable = Readable(pull)
        waiting = asyncio.create_task(readable.wait())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        readable.wake()  # a message kept aside at a reconnection is returned by the waiting receive
        await asyncio.wait_for(waiting, 2)
        readable.close()
    finally:
        pull.close(0)
        context.term()
