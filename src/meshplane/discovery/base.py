"""The discovery interface every backend implements."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

from meshplane.core.snapshots import DiscoveryEvent


class Discovery(abc.ABC):
    """A key/value registry with leases and prefix watches.

    Keys registered through one ``Discovery`` share its lease: they stay while the object is alive
    and kept alive, and disappear (watchers see ``Removed``) when it is closed or its process dies.
    """

    name: str

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect; raise :class:`~meshplane.errors.DiscoveryError` if the backend cannot be reached."""

    @abc.abstractmethod
    async def register(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` on this object's lease; re-registered after backend outages."""

    @abc.abstractmethod
    async def unregister(self, key: str) -> None: ...

    @abc.abstractmethod
    async def list(self, prefix: str) -> dict[str, bytes]:
        """Every live key under ``prefix`` with its value."""

    @abc.abstractmethod
    def list_and_watch(self, prefix: str) -> AsyncIterator[DiscoveryEvent]:
        """``Added`` for every current key, then ``Added``/``Removed`` as things change, forever.

        Backend outages do not end the iteration: the backend reconnects and resynchronises,
        reporting what changed meanwhile.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Drop the lease (every registered key goes away) and release connections."""

    @property
    def registered(self) -> int:
        """How many keys this object keeps alive."""
        return 0
