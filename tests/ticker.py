"""A publisher process that publishes a tick every 20 ms until killed (configured by DYN_* / MESHPLANE_*).

python -m tests.ticker SCOPE TOPIC      prints its publisher id (hex) once registered
"""

from __future__ import annotations

import asyncio
import sys

from meshplane import EventPublisher, Scope


async def main(scope: str, topic: str) -> None:
    async with await EventPublisher.create(Scope.parse(scope), topic) as pub:
        print(f"{pub.publisher_id:x}", flush=True)
        while True:
            await pub.publish(pub.next_sequence)
            await asyncio.sleep(0.02)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
