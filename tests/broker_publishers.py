"""A process with many broker-mode publishers, driven line by line over stdin (for the HA tests).

python -m tests.broker_publishers COUNT EVENTS_PER_PHASE [PAUSE]   (DYN_* variables give the brokers)
PAUSE: seconds between two rounds (one event of every publisher), so that a phase lasts a while.
stdout: "ready" once every publisher sees the subscriber through every broker, then "sent" per phase.
stdin:  "go" starts a phase; "exit" ends.
"""

from __future__ import annotations

import asyncio
import sys

from meshplane import EventPlane, Scope

SCOPE = Scope.endpoint("ha", "worker", "generate")


async def main(count: int, per_phase: int, pause: float) -> None:
    async with EventPlane() as plane:
        publishers = [await plane.publisher(SCOPE, "kv-events") for _ in range(count)]
        brokers = len(plane.config.zmq_brokers)
        # Every broker must carry the subscription to every publisher: then losing a broker loses nothing.
        await asyncio.gather(*(p.wait_for_subscribers(brokers, timeout=60) for p in publishers))
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
            for _ in range(per_phase):
                for pub in publishers:
                    await pub.publish(pub.next_sequence)
                await asyncio.sleep(pause)
            print("sent", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.0))
