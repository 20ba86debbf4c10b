"""Latency and jitter on a link, where the kernel has no ``netem``: a userspace TCP proxy the harness
runs on each host (in its namespace), one listening port per peer host, through which the host's
servers dial that peer. Each chunk read is held until its due time (``delay`` plus up to ``jitter``
more) and written then; a connection's bytes never overtake each other, so jitter shows as bursts
and stalls, not as reordering within a stream.

``python -m tests.chaos.proxy CONTROL PORT=PEER=HOST:PORT ...``: ``CONTROL`` is a file the harness
rewrites, one ``PEER DELAY_MS JITTER_MS`` line per slowed peer (read every 100 ms; a peer not named
is not slowed).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

CHUNK = 64 * 1024
MAX_HELD = 256  # chunks held per direction: beyond it the proxy stops reading (TCP backpressure)
Slowness = tuple[float, float]  # (delay, jitter) in seconds


def due(now: float, previous: float, slowness: Slowness, draw: Callable[[float, float], float]) -> float:
    """When a chunk read at ``now`` is written: ``delay`` plus a draw of up to ``jitter`` later, never
    before the chunk read ahead of it (``previous``)."""
    delay, jitter = slowness
    return max(previous, now + delay + (draw(0.0, jitter) if jitter > 0 else 0.0))


def parse_control(text: str) -> dict[str, Slowness]:
    """``PEER DELAY_MS JITTER_MS`` lines; a torn or bad line is skipped (the file is rewritten whole)."""
    slow: dict[str, Slowness] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3:
            with contextlib.suppress(ValueError):
                slow[fields[0]] = (max(0.0, float(fields[1]) / 1000), max(0.0, float(fields[2]) / 1000))
    return slow


class Proxy:
    def __init__(self, control: Path) -> None:
        self.control = control
        self.slow: dict[str, Slowness] = {}
        self.delayed: dict[str, int] = {}  # chunks held back so far, per peer: the harness's evidence
        self._tasks: set[asyncio.Task[None]] = set()

    async def watch(self) -> None:
        written = ""
        while True:
            with contextlib.suppress(OSError):
                self.slow = parse_control(self.control.read_text())
                counts = "".join(f"{peer} {count}\n" for peer, count in sorted(self.delayed.items()))
                if counts != written:
                    stats = self.control.with_name(self.control.name + ".delayed")
                    stats.with_suffix(".tmp").write_text(counts)
                    stats.with_suffix(".tmp").replace(stats)
                    written = counts
            await asyncio.sleep(0.1)

    async def serve(self, port: int, peer: str, host: str, peer_port: int) -> asyncio.Server:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # The loop holds tasks weakly: each connection's are kept here until they end.
            this = asyncio.current_task()
            assert this is not None
            self._tasks.add(this)
            both: set[asyncio.Task[None]] = set()
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, peer_port), 10)
            except (OSError, TimeoutError):  # the peer down or cut off: the dialler tries again
                writer.close()
                self._tasks.discard(this)
                return
            try:
                both = {
                    asyncio.create_task(self._pump(reader, up_writer, peer)),
                    asyncio.create_task(self._pump(up_reader, writer, peer)),
                }
                self._tasks.update(both)
                # Both ways ended (each a half-close, passed on), or one side broke: then both go.
                await asyncio.wait(both, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for task in both:
                    task.cancel()
                writer.close()
                up_writer.close()
                self._tasks.difference_update({this, *both})

        return await asyncio.start_server(accepted, "127.0.0.1", port, reuse_address=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        """One way of a connection, each chunk written at its due time; its end passed on as a
        half-close once everything before it is written. OSError when either side broke."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_HELD)
        broken: list[OSError] = []
        writing = asyncio.create_task(self._write(held, writer, broken))
        previous = 0.0
        try:
            while chunk := await reader.read(CHUNK):
                if broken:
                    raise broken[0]
                slowness = self.slow.get(peer, (0.0, 0.0))
                if slowness[0] > 0:
                    self.delayed[peer] = self.delayed.get(peer, 0) + 1
                previous = due(time.monotonic(), previous, slowness, random.uniform)
                await held.put((previous, chunk))
            await held.put((previous, b""))
            await writing
            if broken:
                raise broken[0]
        finally:
            writing.cancel()

    @staticmethod
    async def _write(
        held: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter, broken: list[OSError]
    ) -> None:
        """Write each chunk at its time; after a failed write, keep taking chunks (so the reader is
        never stuck on a full queue) and drop them."""
        while True:
            when, chunk = await held.get()
            if broken:
                if not chunk:
                    return
                continue
            await asyncio.sleep(max(0.0, when - time.monotonic()))
            try:
                if not chunk:
                    writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
            except OSError as exc:
                broken.append(exc)


async def main(argv: list[str]) -> None:
    proxy = Proxy(Path(argv[0]))
    servers = []
    for spec in argv[1:]:
        port, peer, target = spec.split("=")
        host, peer_port = target.rsplit(":", 1)
        servers.append(await proxy.serve(int(port), peer, host, int(peer_port)))
    print("ready", flush=True)
    await proxy.watch()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
