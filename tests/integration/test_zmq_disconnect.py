"""Leaving a publisher while libzmq holds the first frame of its next message must not abort the process.

Reading ``ZMQ_EVENTS`` (what the subscriber does before it waits) makes libzmq 4.3.5 fetch that frame
ahead; removing its connection then made the next receive abort the whole process (``!_more`` in
fq.cpp), so the scenario runs in a child process, with and without the C extension.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCENARIO = """
import asyncio, zmq
from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import WireFormat, ZmqEncoder
from meshplane.errors import WireError
from meshplane.transports.zmq import ZmqSubscriberTransport

async def main():
    ctx = zmq.Context()
    publishers = []
    for publisher_id in (1, 2):
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 0)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        encoder = ZmqEncoder(b"kv", publisher_id, WireFormat.HEADER8, Codec.MSGPACK)
        publishers.append((sock, f"tcp://127.0.0.1:{port}", encoder))
    sub = ZmqSubscriberTransport(ctx, b"kv", 0, 1 << 20)
    await sub.start()
    for _, endpoint, _ in publishers:
        sub._socket.connect(endpoint)
    await asyncio.sleep(0.3)
    sequences = [0, 0]
    received = attempts = 0
    deadline = asyncio.get_running_loop().time() + 60  # the scenario ends by itself, loaded machine or not
    for attempt in range(300):
        if asyncio.get_running_loop().time() > deadline:
            break
        attempts += 1
        for index, (sock, _, encoder) in enumerate(publishers):
            for _ in range(20):
                sock.send_multipart(encoder.encode(EventEnvelope(index + 1, sequences[index], 0, "kv", b"x")))
                sequences[index] += 1
        await asyncio.sleep(0.002)
        sub._readable.readable()  # ZMQ_EVENTS: libzmq fetches a first frame ahead
        endpoint = publishers[attempt % 2][1]
        sub.disconnect(endpoint)
        sub._socket.connect(endpoint)
        try:  # what was sent while the connection was down is gone: nothing may come this time
            async with asyncio.timeout(0.5):
                batch = await sub.receive()
        except TimeoutError:
            continue
        assert not any(isinstance(item, WireError) for item in batch), batch
        received += len(batch)
    await sub.close()
    print("ok", received, attempts)

asyncio.run(main())
"""


@pytest.mark.parametrize("extension", ["compiled", "pyzmq"])
def test_disconnecting_while_a_frame_is_fetched_ahead_keeps_the_process_alive(extension: str) -> None:
    env = {"MESHPLANE_NO_EXTENSIONS": "1"} if extension == "pyzmq" else {}
    result = subprocess.run(
        [sys.executable, "-c", SCENARIO],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok ")
    received, attempts = map(int, result.stdout.split()[1:3])
    assert received > 0
    assert attempts >= 50  # disconnections enough to meet a frame fetched ahead
