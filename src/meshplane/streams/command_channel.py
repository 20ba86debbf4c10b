"""Commands over one WebSocket (``/api/v1/ws``): each envelope's answer matched to its caller by
``request_id``, so publishes, group membership and commits cost no HTTP request each."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp
import msgspec

from meshplane.streams.errors import StreamError, error_from_response

_json = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


class CommandChannel:
    """Command envelopes over one WebSocket; answers are matched to callers by ``request_id``."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, timeout: float) -> None:
        self._ws = ws
        self._timeout = timeout
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read(), name="meshplane-command-channel")

    @property
    def closed(self) -> bool:
        return self._reader.done()

    async def call(self, command: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self.closed:
            raise StreamError("the command channel is closed")
        request_id = next(self._ids)
        answer = self._pending[request_id] = asyncio.get_running_loop().create_future()
        try:
            frame = _json.encode({"command": command, "request_id": request_id, "payload": payload})
            try:
                await self._ws.send_frame(frame, aiohttp.WSMsgType.TEXT)
            except ConnectionError as exc:  # the server went before our reader saw the close
                raise StreamError(f"the command channel closed: {exc}") from None
            async with asyncio.timeout(self._timeout):
                envelope = await answer
        finally:
            self._pending.pop(request_id, None)
        return payload_of(envelope)

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                envelope = _json_decoder.decode(message.data)
                waiter = self._pending.get(envelope.get("request_id"))
                if waiter is not None and not waiter.done():
                    waiter.set_result(envelope)
        finally:
            for waiter in self._pending.values():
                if not waiter.done():
                    waiter.set_exception(StreamError("the command channel closed before the answer came"))

    async def close(self) -> None:
        await self._ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)


def payload_of(envelope: dict[str, Any]) -> dict[str, Any]:
    if not envelope.get("success"):
        message = str(envelope.get("error") or "command failed").removeprefix("Invalid request: ")
        if "code" in envelope:
            raise error_from_response(int(envelope["code"]), {**envelope, "error": message})
        raise StreamError(message)
    payload: dict[str, Any] = envelope["payload"]
    return payload
