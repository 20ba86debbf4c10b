"""Synap's own Python SDK against meshplane's streams server (`make run` starts one on port 15500 and
installs the SDK; elsewhere: pip install 'meshplane[examples]')."""

import asyncio
import os

from synap_sdk import SynapClient, SynapConfig

URL = os.environ.get("MESHPLANE_STREAMS_URL", "http://127.0.0.1:15500")


async def main() -> None:
    async with SynapClient(SynapConfig(URL)) as synap:
        offset = await synap.stream.publish("chat-room-1", "message", {"text": "hi"})
        events = await synap.stream.read("chat-room-1", offset=offset)
        print("read back", events[0].data)


asyncio.run(main())
