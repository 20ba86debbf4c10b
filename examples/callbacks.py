"""Tango-style subscriptions: a callback per event id for events, notices and errors."""

import asyncio

from meshplane import EventEnvelope, EventPlane, Scope


async def main() -> None:
    scope = Scope.endpoint("dynamo", "worker", "generate")
    async with EventPlane() as plane:
        first = asyncio.get_running_loop().create_future()

        def on_event(item: object) -> None:  # an EventEnvelope, a notice, or a MeshplaneError; may be async
            if not first.done():
                first.set_result(item)

        pub = await plane.publisher(scope, "tango-events")
        # fails at once when nobody publishes; stateless=True always succeeds and connects when it can
        event_id = await plane.subscribe_event(scope, "tango-events", on_event)
        later_id = await plane.subscribe_event(scope, "tango-events", on_event, stateless=True)
        await pub.wait_for_subscribers(1, timeout=5)
        await pub.publish("hello")
        item = await asyncio.wait_for(first, 5)
        print("received", item.decode() if isinstance(item, EventEnvelope) else item)
        await plane.unsubscribe_event(event_id)  # no call after this returns
        await plane.unsubscribe_event(later_id)


asyncio.run(main())
