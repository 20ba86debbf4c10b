"""The Dynamo runtime (ai-dynamo-runtime 1.6.1) as a peer of the interop tests, under .venv-dynamo's Python.

The runtime exposes one Python pair that carries an event per call over its event plane: the
forward-pass metrics publisher (``FpmDirectPublisher``) and subscriber (``FpmEventSubscriber``), on the
endpoint ``interop.worker.generate``, topic ``forward-pass-metrics``. This file imports only the standard
library and ``dynamo`` (the runtime's venv has neither msgpack nor meshplane): payloads cross stdout as hex
and the tests decode them.

    python dynamo_peer.py pub BACKEND PLANE   # registers, says {"ready": ...}; then reads commands:
                                              #   "publish N": N snapshots (values from `snapshot`), says
                                              #   {"published": N}; "quit" (or end of input): shuts down
    python dynamo_peer.py sub BACKEND PLANE   # says {"ready": true} once its receiving thread runs, then
                                              # {"payload": hex} per message; exits at end of input

BACKEND is the runtime's discovery backend (file, etcd), PLANE its event plane (zmq, nats); the rest
comes from the environment the test sets (DYN_FILE_KV, ETCD_ENDPOINTS, NATS_SERVER, DYN_EVENT_PLANE_HOST).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from typing import Any

from dynamo._core import DistributedRuntime, FpmDirectPublisher, FpmEventSubscriber

ENDPOINT = "interop.worker.generate"
WORKER_ID = "dynamo-peer"


def emit(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def snapshot(i: int) -> dict[str, Any]:
    """The arguments of the i-th published snapshot: every metric differs, so a test can tell them apart
    (the tests compute the same values: tests/integration/test_dynamo_runtime.py)."""
    return {
        "dp_rank": 0,
        "scheduled_num_prefill_requests": i,
        "scheduled_sum_prefill_tokens": 1000 + i,
        "scheduled_sum_prefill_kv_tokens": 2000 + i,
        "scheduled_num_decode_requests": 3000 + i,
        "scheduled_sum_decode_kv_tokens": 4000 + i,
        "queued_num_prefill_requests": 5000 + i,
        "queued_sum_prefill_tokens": 6000 + i,
        "queued_num_decode_requests": 7000 + i,
        "queued_sum_decode_kv_tokens": 8000 + i,
        "wall_time_secs": 1_700_000_000.0 + i,
    }


def runtime(backend: str, plane: str) -> DistributedRuntime:
    return DistributedRuntime(asyncio.get_running_loop(), backend, "tcp", event_plane=plane)


async def publish(backend: str, plane: str) -> None:
    rt = runtime(backend, plane)
    publisher = FpmDirectPublisher(rt.endpoint(ENDPOINT), WORKER_ID, 1)
    emit({"ready": True})
    while (line := await asyncio.to_thread(sys.stdin.readline)).strip() not in ("", "quit"):
        command, count = line.split()
        assert command == "publish", line
        for i in range(int(count)):
            publisher.publish(**snapshot(i))
        emit({"published": int(count)})
    publisher.shutdown()
    rt.shutdown()


async def subscribe(backend: str, plane: str) -> None:
    rt = runtime(backend, plane)
    subscriber = FpmEventSubscriber(rt.endpoint(ENDPOINT))

    def receive() -> None:
        while (payload := subscriber.recv()) is not None:
            emit({"payload": payload.hex()})

    threading.Thread(target=receive, daemon=True).start()
    emit({"ready": True})
    await asyncio.to_thread(sys.stdin.read)  # until the test closes our input
    rt.shutdown()
    os._exit(0)  # not waiting for the receiving thread, blocked in recv()


if __name__ == "__main__":
    role, backend_arg, plane_arg = sys.argv[1:4]
    asyncio.run((publish if role == "pub" else subscribe)(backend_arg, plane_arg))
