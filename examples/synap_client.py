"""Synap's own Python SDK against meshplane's streams server (`make run` starts one on port 15500 and
installs the SDK; elsewhere: pip install 'meshplane[examples]')."""

import asyncio

from synap_sdk import SynapClient, SynapConfig

from meshplane.context import streams_endpoint

# The server and token the CLI uses: $MESHPLANE_STREAMS_URL/_TOKEN, or the selected context (`make run`'s)
URL, TOKEN = streams_endpoint()


async def main() -> None:
    async with SynapClient(SynapConfig(URL, auth_token=TOKEN)) as synap:
        offset = await synap.stream.publish("chat-room-1", "message", {"text": "hi"})
        events = await synap.stream.read("chat-room-1", offset=offset)
        print("read back", events[0].data)


asyncio.run(main())
