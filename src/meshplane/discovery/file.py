"""File discovery in Dynamo 1.6.1's layout: one file per key, atomic writes, mtime keep-alive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from meshplane.core.records import file_name_to_key, key_to_file_name
from meshplane.core.snapshots import DiscoveryEvent, diff_snapshot
from meshplane.discovery.base import Discovery
from meshplane.errors import DiscoveryError, InvalidName

log = logging.getLogger(__name__)


class FileDiscovery(Discovery):
    """Records live in ``<root>/<bucket>/<escaped key>``; an owner touches its files every ``ttl / 3``.

    A file whose mtime is older than ``ttl`` belongs to a process that stopped: readers treat it as
    removed and delete it (its owner, if it comes back, writes it again).
    """

    name = "file"

    def __init__(self, root: Path, ttl: float = 10.0, poll_interval: float = 0.1) -> None:
        self.root = Path(root)
        self.ttl = ttl
        self.poll_interval = poll_interval
        self._owned: dict[str, bytes] = {}
        self._keepalive: asyncio.Task[None] | None = None
        self._bad_names: set[str] = set()
        self._cache: dict[str, tuple[tuple[int, int], bytes]] = {}

    async def start(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DiscoveryError(f"cannot create the discovery folder {self.root}: {exc}") from exc

    def _path(self, key: str) -> Path:
        bucket, name = key_to_file_name(key)
        return self.root / bucket / name

    def _write(self, key: str, value: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Dotted temp name: readers skip it, and rename makes the record appear whole or not at all.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(value)
        os.replace(tmp, path)

    async def register(self, key: str, value: bytes) -> None:
        try:
            await asyncio.to_thread(self._write, key, value)
        except OSError as exc:
            raise DiscoveryError(f"cannot write discovery record {key}: {exc}") from exc
        self._owned[key] = value
        if self._keepalive is None or self._keepalive.done():
            self._keepalive = asyncio.create_task(self._keep_alive(), name="meshplane-file-keepalive")

    async def unregister(self, key: str) -> None:
        self._owned.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self._path(key).unlink)

    def _touch_owned(self) -> None:
        for key, value in list(self._owned.items()):
            try:
                os.utime(self._path(key))
            except FileNotFoundError:
                log.info("discovery record %s vanished; writing it again", key)
                self._write(key, value)

    async def _keep_alive(self) -> None:
        while self._owned:
            await asyncio.sleep(self.ttl / 3)
            try:
                await asyncio.to_thread(self._touch_owned)
            except OSError as exc:
                log.warning("file discovery keep-alive failed (will retry): %s", exc)

    def _scan(self, prefix: str) -> dict[str, bytes]:
        bucket = "/".join(prefix.split("/", 2)[:2])
        folder = self.root / bucket
        now = time.time()
        found: dict[str, bytes] = {}
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return found
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                key = file_name_to_key(bucket, entry.name)
            except InvalidName as exc:
                if entry.name not in self._bad_names:
                    self._bad_names.add(entry.name)
                    log.warning("ignoring discovery file %s: %s", entry.path, exc)
                continue
            if not key.startswith(prefix):
                continue
            try:
                stat = entry.stat()
                if now - stat.st_mtime > self.ttl and key not in self._owned:
                    log.info("discovery record %s expired (owner stopped touching it)", key)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    continue
                # Writers replace files whole, so the same inode and size means the same content.
                cached = self._cache.get(key)
                if cached is None or cached[0] != (stat.st_ino, stat.st_size):
                    with open(entry.path, "rb") as f:
                        cached = ((stat.st_ino, stat.st_size), f.read())
                    self._cache[key] = cached
                found[key] = cached[1]
            except FileNotFoundError:
                continue  # removed between listing and reading
        for key in [k for k in self._cache if k.startswith(prefix) and k not in found]:
            del self._cache[key]
        return found

    async def list(self, prefix: str) -> dict[str, bytes]:
        return await asyncio.to_thread(self._scan, prefix)

    async def list_and_watch(self, prefix: str) -> AsyncIterator[DiscoveryEvent]:
        known: dict[str, bytes] = {}
        while True:
            try:
                snapshot = await self.list(prefix)
            except OSError as exc:
                log.warning("cannot scan discovery folder %s (will retry): %s", self.root, exc)
            else:
                for event in diff_snapshot(known, snapshot):
                    yield event
            await asyncio.sleep(self.poll_interval)

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        for key in list(self._owned):
            await self.unregister(key)

    @property
    def registered(self) -> int:
        return len(self._owned)
