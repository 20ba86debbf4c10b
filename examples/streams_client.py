"""meshplane's own streams client: topics, keyed publishes, a consumer group member that commits
exactly what it handled (fenced by its generation), room replay."""

import asyncio
import contextlib

from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import Conflict


async def main() -> None:
    # No URL: the server and token the CLI uses ($MESHPLANE_STREAMS_URL/_TOKEN or the selected context)
    async with StreamsClient() as client:
        if "orders" not in await client.topics():
            await client.create_topic(
                "orders", 3, retention_policy={"type": "Messages", "max_messages": 100000}
            )
        await client.publish_to_topic("orders", "order.created", {"id": 1}, key="customer-123")
        with contextlib.suppress(Conflict):  # made by an earlier run
            await client.create_group("processors", "orders")
        member = await client.join("processors")  # {"member_id", "generation", "partitions"}
        handled = 0
        for partition in member["partitions"]:
            start = await client.committed("processors", partition) or 0
            batch = await client.consume_partition("orders", partition, start, limit=100)
            for event in batch["events"]:
                handled += 1  # handle the event here, then commit past it: never past what was handled
                await client.commit(
                    "processors",
                    partition,
                    event["offset"] + 1,
                    member_id=member["member_id"],
                    generation=member["generation"],
                )
        await client.leave("processors", member["member_id"])
        await client.publish("chat-room-1", "message", {"text": "hi"})
        async for event in client.subscribe("chat-room-1", from_offset=-1):  # the last one, then live
            print("replayed", event["data"], "; handled and committed", handled, "orders")
            break

    # Publishes, heartbeats and commits as commands over one WebSocket (/api/v1/ws): same answers,
    # about a third of an HTTP round trip each.
    async with StreamsClient(channel=True) as client:
        await client.publish_to_topic("orders", "order.created", {"id": 2}, key="customer-123")


asyncio.run(main())
