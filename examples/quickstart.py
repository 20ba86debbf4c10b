"""Publish and subscribe on one topic (`make run` in another shell, or NATS_SERVER and discovery set)."""

import asyncio

from meshplane import EventPublisher, EventSubscriber, Scope


async def main() -> None:
    scope = Scope.endpoint("dynamo", "worker", "generate")  # or Scope.component(ns, c), Scope.namespace(ns)
    sub = await EventSubscriber.create(scope, "hello-events")  # discovers publishers, now and later
    pub = await EventPublisher.create(scope, "hello-events")  # binds/connects and registers in discovery
    await pub.wait_for_subscribers(1, timeout=5)  # ZeroMQ's slow joiner: wait until the subscriber is in
    await pub.publish({"stored": [1, 2, 3]})  # bytes as they are, anything else as MessagePack
    envelope = await sub.next(timeout=5)  # or: async for envelope in sub
    print(f"publisher {envelope.publisher_id:x} event {envelope.sequence}:", envelope.decode())
    await pub.close()  # unregisters; also `async with`
    await sub.close()


asyncio.run(main())
