"""meshplane's own streams client: topics, keyed publishes, replay, a consumer group's fenced commit."""

import asyncio
import contextlib
import os

from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import Conflict

URL = os.environ.get("MESHPLANE_STREAMS_URL", "http://127.0.0.1:15500")


async def main() -> None:
    async with StreamsClient(URL) as client:
        if "orders" not in await client.topics():
            await client.create_topic(
                "orders", 3, retention_policy={"type": "Messages", "max_messages": 100000}
            )
        partition, offset = await client.publish_to_topic(
            "orders", "order.created", {"id": 1}, key="customer-123"
        )
        with contextlib.suppress(Conflict):  # made by an earlier run
            await client.create_group("processors", "orders")
        member = await client.join("processors")  # {"member_id", "generation", "partitions"}
        await client.commit(
            "processors",
            partition,
            offset + 1,
            member_id=member["member_id"],
            generation=member["generation"],
        )
        await client.leave("processors", member["member_id"])
        await client.publish("chat-room-1", "message", {"text": "hi"})
        async for event in client.subscribe("chat-room-1", from_offset=-1):  # the last one, then live
            print("replayed", event["data"], "; committed", offset + 1, "in partition", partition)
            break

    # Publishes, heartbeats and commits as commands over one WebSocket (/api/v1/ws): same answers,
    # about a third of an HTTP round trip each.
    async with StreamsClient(URL, channel=True) as client:
        await client.publish_to_topic("orders", "order.created", {"id": 2}, key="customer-123")


asyncio.run(main())
