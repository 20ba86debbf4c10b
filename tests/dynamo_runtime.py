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
START_TIMEOUT = 30.0


def require_runtime() -> Path:
    """The Dynamo runtime's Python, or a failure that says how to install it."""
    if not DYNAMO_PYTHON.exists():
        raise AssertionError(
            f"no {DYNAMO_PYTHON}: `make .venv-dynamo` installs the Dynamo runtime "
            f"(ai-dynamo-runtime=={VERSION}) that these tests run against (`make test` does it first)"
        )
    return DYNAMO_PYTHON


def runtime_env(**env: str) -> dict[str, str]:
    """The peer's environment: loopback only, quiet logs, and the test's discovery and servers."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "ETCD_", "NATS_"))}
    return {
        **out,
        "DYN_LOG": "warn",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        **env,
    }


def snapshot_values(i: int, worker_id: str = WORKER_ID) -> dict[str, Any]:
    """The metrics of the peer's i-th published snapshot (``dynamo_peer.snapshot``) under the names of the
    runtime's payload: a MessagePack map whose request counts are in two nested maps."""
    return {
        "worker_id": worker_id,
        "dp_rank": 0,
        "wall_time": 1_700_000_000.0 + i,
        "scheduled_requests": {
            "num_prefill_requests": i,
            "sum_prefill_tokens": 1000 + i,
            "sum_prefill_kv_tokens": 2000 + i,
            "num_decode_requests": 3000 + i,
            "sum_decode_kv_tokens": 4000 + i,
        },
        "queued_requests": {
            "num_prefill_requests": 5000 + i,
            "sum_prefill_tokens": 6000 + i,
            "num_decode_requests": 7000 + i,
            "sum_decode_kv_tokens": 8000 + i,
        },
    }


def snapshot_metrics(payload: bytes) -> dict[str, Any]:
    """Of one forward-pass-metrics payload, the fields :func:`snapshot_values` sets."""
    value = msgpack.unpackb(payload)
    return {
        k: {m: value[k][m] for m in v} if isinstance(v, dict) else value[k]
        for k, v in snapshot_values(0).items()
    }


def snapshot_payload(i: int, worker_id: str) -> bytes:
    """A forward-pass-metrics payload laid out as the runtime's own (the captured one's keys, in order,
    variances 0.0), with :func:`snapshot_values`; ``counter_id`` counts from 1 as the runtime's does."""
    values = snapshot_values(i, worker_id)
    scheduled, queued = values["scheduled_requests"], values["queued_requests"]
    payload: bytes = msgpack.packb(
        {
            "version": 1,
            "worker_id": worker_id,
            "dp_rank": 0,
            "counter_id": i + 1,
            "wall_time": values["wall_time"],
            "scheduled_requests": {
                "num_prefill_requests": scheduled["num_prefill_requests"],
                "sum_prefill_tokens": scheduled["sum_prefill_tokens"],
                "var_prefill_length": 0.0,
                "sum_prefill_kv_tokens": scheduled["sum_prefill_kv_tokens"],
                "num_decode_requests": scheduled["num_decode_requests"],
                "sum_decode_kv_tokens": scheduled["sum_decode_kv_tokens"],
                "var_decode_kv_tokens": 0.0,
            },
            "queued_requests": {
                "num_prefill_requests": queued["num_prefill_requests"],
                "sum_prefill_tokens": queued["sum_prefill_tokens"],
                "var_prefill_length": 0.0,
                "num_decode_requests": queued["num_decode_requests"],
                "sum_decode_kv_tokens": queued["sum_decode_kv_tokens"],
                "var_decode_kv_tokens": 0.0,
            },
        }
    )
    return payload


class Peer:
    """One runtime process: JSON lines out (read by a task into a queue), commands in; stopped by PID."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path, role: str) -> None:
        self.proc, self.log, self.role = proc, log, role
        self._lines: asyncio.Queue[bytes] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read_lines())

    async def _read_lines(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self._lines.put_nowait(line)
        self._lines.put_nowait(b"")  # its output ended

    async def poll(self, timeout: float) -> dict[str, Any] | None:
        """Its next message, or None if it said nothing within ``timeout``."""
        try:
            line = await asyncio.wait_for(self._lines.get(), timeout)
        except TimeoutError:
            return None
        if not line:
            self._lines.put_nowait(b"")
            raise AssertionError(f"the Dynamo {self.role} exited ({await self.proc.wait()}){self.log_tail()}")
        message: dict[str, Any] = json.loads(line)
        return message

    async def read(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        if (message := await self.poll(timeout)) is None:
            raise AssertionError(f"the Dynamo {self.role} said nothing for {timeout:g}s{self.log_tail()}")
        return message

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    def log_tail(self) -> str:
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
        await peer._reader
