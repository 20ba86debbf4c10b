"""A process that registers one discovery key and keeps it alive until killed (for lease tests).

python -m tests.registrar {file DIR TTL | etcd ENDPOINT TTL} KEY VALUE
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from meshplane.discovery.base import Discovery
from meshplane.discovery.etcd import EtcdDiscovery
from meshplane.discovery.file import FileDiscovery


async def main(argv: list[str]) -> None:
    backend, where, ttl, key, value = argv
    discovery: Discovery
    if backend == "file":
        discovery = FileDiscovery(Path(where), ttl=float(ttl))
    else:
        discovery = EtcdDiscovery((where,), lease_ttl=int(ttl))
    await discovery.start()
    await discovery.register(key, value.encode())
    print("registered", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
