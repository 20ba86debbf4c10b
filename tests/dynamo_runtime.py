"""Drive the real Dynamo runtime (``tests/dynamo_peer.py`` under ``.venv-dynamo``'s Python) from a test.

``make test`` installs ``.venv-dynamo`` (ai-dynamo-runtime 1.6.1 in a venv of its own: it pins a pydantic
older than meshplane's); without it these tests fail saying so, they never skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parent.parent
DYNAMO_PYTHON = Path(os.environ.get("MESHPLANE_DYNAMO_PYTHON") or ROOT / ".venv-dynamo" / "bin" / "python")
PEER = Path(__file__).resolve().parent / "dynamo_peer.py"
VERSION = "1.6.1"
ENDPOINT = ("interop", "worker", "generate")  # dynamo_peer.ENDPOINT
TOPIC = "forward-pass-metrics"
WORKER_ID = "dynamo-peer"  # dynamo_peer.WORKER_ID
# The runtime's peer starts in about a second; a loaded 2-core machine may take several.
START_TIMEOUT = 60.0


def require_runtime() -> Path:
    """The Dynamo runtime's Python, or a failure that says how to install it."""
    if not DYNAMO_PYTHON.exists():
        raise AssertionError(
            f"no {DYNAMO_PYTHON}: `make .venv-dynamo` installs the Dynamo runtime (ai-dynamo-runtime=={VERSION}) "
            "that these tests run against (`make test` does it first)"
        )
    return DYNAMO_PYTHON


def runtime_env(**env: str) -> dict[str, str]:
    """The peer's environment: loopback only, quiet logs, and the test's discovery and servers."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "ETCD_", "NATS_"))}
    return {**out, "DYN_LOG": "warn", "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_TCP_RPC_HOST": "127.0.0.1", **env}


def snapshot_values(i: int) -> dict[str, Any]:
    """The metrics of the peer's i-th published snapshot (``dynamo_peer.snapshot``), as the runtime
    serializes them (the payload's MessagePack map)."""
    return {
        "worker_id": WORKER_ID,
        "dp_rank": 0,
        "wall_time": 1_700_000_000.0 + i,
        "num_prefill_requests": i,
        "sum_prefill_tokens": 1000 + i,
        "sum_prefill_kv_tokens": 2000 + i,
        "num_decode_requests": 3000 + i,
        "sum_decode_kv_tokens": 4000 + i,
        "queued_num_prefill_requests": 5000 + i,
        "queued_sum_prefill_tokens": 6000 + i,
        "queued_num_decode_requests": 7000 + i,
        "queued_sum_decode_kv_tokens": 8000 + i,
    }


def snapshot_metrics(payload: bytes) -> dict[str, Any]:
    """The metrics of one forward-pass-metrics payload (a MessagePack map with nested request groups),
    flattened to the names of :func:`snapshot_values`."""
    value = msgpack.unpackb(payload)
    scheduled, queued = value["scheduled_requests"], value["queued_requests"]
    return {
        "worker_id": value["worker_id"],
        "dp_rank": value["dp_rank"],
        "wall_time": value["wall_time"],
        **{k: scheduled[k] for k in snapshot_values(0) if k in scheduled},
        **{f"queued_{k}": queued[k] for k in queued if f"queued_{k}" in snapshot_values(0)},
    }


class Peer:
    """One runtime process: JSON lines out, commands in; stopped by PID."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path, role: str) -> None:
        self.proc, self.log, self.role = proc, log, role

    async def read(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise AssertionError(f"the Dynamo {self.role} said nothing for {timeout:g}s{self._log_tail()}") from None
        if not line:
            raise AssertionError(f"the Dynamo {self.role} exited ({await self.proc.wait()}){self._log_tail()}")
        message: dict[str, Any] = json.loads(line)
        return message

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def payloads(self, count: int, timeout: float = 30.0) -> list[bytes]:
        """The next ``count`` payloads a subscriber received (each within ``timeout``)."""
        return [bytes.fromhex((await self.read(timeout))["payload"]) for _ in range(count)]

    def _log_tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"; its log ends:\n{text[-3000:]}" if text else ""


@contextlib.asynccontextmanager
async def dynamo(role: str, backend: str, plane: str, log_dir: Path, **env: str) -> AsyncIterator[Peer]:
    """The runtime's publisher (``pub``) or subscriber (``sub``), ready; shut down afterwards."""
    log = log_dir / f"dynamo-{role}.log"
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            str(require_runtime()),
            str(PEER),
            role,
            backend,
            plane,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=runtime_env(**env),
        )
    peer = Peer(proc, log, role)
    try:
        assert (await peer.read())["ready"]
        yield peer
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ConnectionError):
                await peer.send("quit")
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
