"""In-process discovery: every ``MemoryDiscovery`` in a process shares one store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from meshplane.core.snapshots import Added, DiscoveryEvent, Removed
from meshplane.discovery.base import Discovery


class _Store:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.watchers: set[tuple[str, asyncio.Queue[DiscoveryEvent]]] = set()

    def notify(self, event: DiscoveryEvent) -> None:
        for prefix, queue in self.watchers:
            if event.key.startswith(prefix):
                queue.put_nowait(event)


_STORE = _Store()


class MemoryDiscovery(Discovery):
    name = "mem"

    def __init__(self) -> None:
        self._owned: set[str] = set()

    async def start(self) -> None:
        return None

    async def register(self, key: str, value: bytes) -> None:
        self._owned.add(key)
        _STORE.values[key] = value
        _STORE.notify(Added(key, value))

    async def unregister(self, key: str) -> None:
        self._owned.discard(key)
        if _STORE.values.pop(key, None) is not None:
            _STORE.notify(Removed(key))

    async def list(self, prefix: str) -> dict[str, bytes]:
        return {k: v for k, v in _STORE.values.items() if k.startswith(prefix)}

    async def list_and_watch(self, prefix: str) -> AsyncIterator[DiscoveryEvent]:
        queue: asyncio.Queue[DiscoveryEvent] = asyncio.Queue()
        watcher = (prefix, queue)
        _STORE.watchers.add(watcher)
        try:
            for key, value in (await self.list(prefix)).items():
                yield Added(key, value)
            while True:
                yield await queue.get()
        finally:
            _STORE.watchers.discard(watcher)

    async def close(self) -> None:
        for key in list(self._owned):
            await self.unregister(key)

    @property
    def registered(self) -> int:
        return len(self._owned)
