"""``StreamsClient``: an async client for every operation of ``meshplane serve``.

>>> async with StreamsClient("http://127.0.0.1:15500") as client:
...     offset = await client.publish("chat", "message", {"text": "hi"})
...     async for event in client.subscribe("chat", from_offset=-50):
...         print(event["offset"], event["data"])

With ``channel=True`` publishes, group membership and offset commits go as commands over one
WebSocket (``/api/v1/ws``) instead of an HTTP request each: the same answers, a fraction of the latency.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import aiohttp
import msgspec

from meshplane.core.mesh.vpn import check_vpn
from meshplane.core.streamlog import Record, scan_records
from meshplane.streams.command_channel import CommandChannel, payload_of
from meshplane.streams.errors import (
    UNAUTHORIZED,
    StreamError,
    Unauthorized,
    error_from_response,
    not_a_streams_server,
    not_http,
)

T = TypeVar("T")

_json = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


class Fetched(NamedTuple):
    records: list[Record]
    log_start_offset: int
    log_end_offset: int  # the next offset to be written


class StreamsClient:
    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        channel: bool = False,
        tls: ssl.SSLContext | None = None,
        vpn: str | None = None,
    ) -> None:
        """``url``: a server, or several serving the same streams (``meshplane serve --storage nats://``),
        comma-separated or a list: when the current one cannot be reached, the next is tried. None:
        the server the CLI uses (``$MESHPLANE_STREAMS_URL``, the selected context's, or port 15500 on
        loopback), with its token unless ``token`` is given; a URL given here never gets the context's
        token. ``tls``: how to check an https server (default: the system's CAs, or $SSL_CERT_FILE).
        ``vpn``: the Message VPN an operator's token works in (a VPN's own token needs none)."""
        if url is None:
            from meshplane.context import streams_endpoint

            url, found = streams_endpoint()
            token = token or found
        urls = url.split(",") if isinstance(url, str) else list(url)
        self.urls = [u.strip().rstrip("/") for u in urls if u.strip()]
        if not self.urls:
            raise StreamError("StreamsClient needs a server URL")
        self._current = 0
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if vpn is not None:
            try:  # checked here: a header with a line break or a stray name would fail far from its cause
                headers["X-Meshplane-Vpn"] = check_vpn(vpn)
            except ValueError as error:
                raise StreamError(str(error)) from None
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
            connector=aiohttp.TCPConnector(ssl=tls if tls is not None else True),
        )
        self._timeout = timeout
        self._use_channel = channel
        self._channel: CommandChannel | None = None
        self._channel_opening = asyncio.Lock()

    @property
    def channel_open(self) -> bool:
        """Whether commands go over an open WebSocket command channel (``channel=True``)."""
        return self._channel is not None and not self._channel.closed

    @property
    def url(self) -> str:
        """The server requests go to now."""
        return self.urls[self._current]

    async def _on_a_server(self, attempt: Callable[[str], Awaitable[T]]) -> T:
        """``attempt(url)`` on the current server, and on the next ones in turn while a server cannot
        be connected to: nothing was sent then, so repeating any request is safe. (A server that
        fails after the request was sent may have done it: that error is the caller's to retry.)"""
        for tries_left in reversed(range(len(self.urls))):
            try:
                return await attempt(self.url)
            except aiohttp.ClientConnectorError:
                if not tries_left:
                    raise
                self._current = (self._current + 1) % len(self.urls)
            except aiohttp.ClientResponseError as exc:
                if exc.status == 400 and "status line" in exc.message:  # not HTTP at all
                    raise StreamError(not_http(self.url, exc.message)) from None
                raise
        raise AssertionError("unreachable")

    async def __aenter__(self) -> StreamsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        await self._session.close()

    async def _command_channel(self) -> CommandChannel:
        """The open command WebSocket; opened on first use and again after it drops."""
        async with self._channel_opening:
            if self._channel is None or self._channel.closed:
                ws = await self._on_a_server(
                    lambda url: self._session.ws_connect(url.replace("http", "ws", 1) + "/api/v1/ws")
                )
                self._channel = CommandChannel(ws, self._timeout)
            return self._channel

    async def _call(
        self,
        command: str,
        payload: dict[str, Any],
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An operation that is both a command and a REST route: over the channel if enabled."""
        if self._use_channel:
            return await (await self._command_channel()).call(command, payload)
        return await self.request(method, path, body)

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}

        async def attempt(url: str) -> dict[str, Any]:
            async with self._session.request(method, url + path, json=body, params=query) as response:
                if response.status == 401:
                    raise Unauthorized(UNAUTHORIZED)
                try:
                    data = await response.json(content_type=None) if response.content_length != 0 else {}
                except ValueError:
                    raise StreamError(not_a_streams_server(url, response.status)) from None
                if response.status >= 400:
                    raise error_from_response(response.status, data)
                result: dict[str, Any] = data
                return result

        return await self._on_a_server(attempt)

    # --- rooms ---------------------------------------------------------------------------------------

    async def create_room(
        self,
        room: str,
        *,
        max_events: int | None = None,
        retention_secs: float | None = None,
        exist_ok: bool = False,
    ) -> dict[str, Any]:
        body = {
            k: v for k, v in (("max_events", max_events), ("retention_secs", retention_secs)) if v is not None
        }
        return await self.request("PUT" if exist_ok else "POST", f"/stream/{room}", body)

    async def delete_room(self, room: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/stream/{room}")

    async def rooms(self) -> list[str]:
        return list((await self.request("GET", "/stream/list"))["rooms"])

    async def publish(self, room: str, event: str, data: Any, metadata: dict[str, str] | None = None) -> int:
        body: dict[str, Any] = {"event": event, "data": data}
        if metadata:
            body["metadata"] = metadata
        answer = await self._call(
            "stream.publish", {**body, "room": room}, "POST", f"/stream/{room}/publish", body
        )
        return int(answer["offset"])

    async def consume(
        self, room: str, subscriber_id: str, from_offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        return await self.request(
            "GET",
            f"/stream/{room}/consume/{subscriber_id}",
            params={"from_offset": from_offset, "limit": limit},
        )

    async def history(
        self, room: str, from_offset: int | None = None, to_offset: int | None = None, limit: int = 100
    ) -> dict[str, Any]:
        return await self.request(
            "GET",
            f"/stream/{room}/history",
            params={"from_offset": from_offset, "to_offset": to_offset, "limit": limit},
        )

    async def room_stats(self, room: str) -> dict[str, Any]:
        return await self.request("GET", f"/stream/{room}/stats")

    async def subscribe(
        self, room: str, subscriber_id: str = "meshplane-client", from_offset: int | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Events pushed over the room's WebSocket, from ``from_offset`` (None: only new ones), in the shape
        history gives them (the frame's ``type: event`` and ``event_id`` are Synap's framing)."""
        params = {} if from_offset is None else {"from_offset": str(from_offset)}
        path = f"/stream/{room}/ws/{subscriber_id}"
        ws = await self._on_a_server(
            lambda url: self._session.ws_connect(url.replace("http", "ws", 1) + path, params=params)
        )
        async with ws:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                frame = json.loads(message.data)
                if frame.get("type") == "event":
                    frame.pop("event_id", None)
                    yield {**frame, "type": frame.get("event_type", frame.get("event"))}
                elif frame.get("type") == "error":
                    raise StreamError(frame.get("error", "subscription failed"))

    # --- pub/sub -------------------------------------------------------------------------------------

    async def command(self, command: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The command endpoint (Synap's ``stream.*``, ``pubsub.*``; meshplane's ``topic.*``, ``group.*``)."""
        if self._use_channel:
            return await (await self._command_channel()).call(command, payload)
        return payload_of(
            await self.request("POST", "/api/v1/command", {"command": command, "payload": payload})
        )

    async def pubsub_publish(self, topic: str, payload: Any) -> int:
        return int(
            (await self.command("pubsub.publish", {"topic": topic, "payload": payload}))[
                "subscribers_matched"
            ]
        )

    # --- topics --------------------------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        num_partitions: int = 3,
        *,
        retention_policy: dict[str, Any] | None = None,
        segment_bytes: int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"num_partitions": num_partitions}
        if retention_policy is not None:
            body["retention_policy"] = retention_policy
        if segment_bytes is not None:
            body["segment_bytes"] = segment_bytes
        return await self.request("POST", f"/topics/{topic}", body)

    async def add_partitions(self, topic: str, num_partitions: int) -> dict[str, Any]:
        """Grow ``topic`` to ``num_partitions``."""
        return await self.request("POST", f"/topics/{topic}/partitions", {"num_partitions": num_partitions})

    async def delete_topic(self, topic: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/topics/{topic}")

    async def topics(self) -> list[str]:
        return list((await self.request("GET", "/topics"))["topics"])

    async def publish_to_topic(
        self,
        topic: str,
        event_type: str,
        data: Any,
        *,
        key: str | bytes | None = None,
        partition: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> tuple[int, int]:
        body: dict[str, Any] = {"event_type": event_type, "data": data}
        if isinstance(key, bytes):  # any bytes, as Kafka's keys
            body["key_base64"] = base64.b64encode(key).decode()
            key = None
        for name, value in (("key", key), ("partition", partition), ("metadata", metadata)):
            if value is not None:
                body[name] = value
        answer = await self._call(
            "topic.publish", {**body, "topic": topic}, "POST", f"/topics/{topic}/publish", body
        )
        return int(answer["partition_id"]), int(answer["offset"])

    async def publish_batch(
        self,
        topic: str,
        events: list[dict[str, Any]],
        *,
        partition: int | None = None,
        idempotency_key: str | None = None,
    ) -> list[tuple[int, int]]:
        """Publish many events in one request: each ``{event_type, data, key?, metadata?}``.

        Repeating a request with the same ``idempotency_key`` appends nothing (and answers the same).
        """
        body: dict[str, Any] = {"events": events}
        if partition is not None:
            body["partition"] = partition
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        answer = await self._call(
            "topic.publish", {**body, "topic": topic}, "POST", f"/topics/{topic}/publish", body
        )
        return [(int(r["partition_id"]), int(r["offset"])) for r in answer["results"]]

    async def consume_partition(
        self, topic: str, partition: int, from_offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        return await self.request(
            "POST",
            f"/topics/{topic}/partitions/{partition}/consume",
            {"from_offset": from_offset, "limit": limit},
        )

    async def fetch(
        self, topic: str, partition: int, from_offset: int = 0, max_bytes: int = 1 << 20
    ) -> Fetched:
        """Bulk read: whole records from ``from_offset`` (payloads still encoded; see decode_event)."""
        path = f"/topics/{topic}/partitions/{partition}/records"
        params = {"from_offset": str(from_offset), "max_bytes": str(max_bytes)}

        async def attempt(url: str) -> Fetched:
            async with self._session.get(url + path, params=params) as response:
                if response.status >= 400:
                    raise error_from_response(response.status, await response.json(content_type=None))
                data = await response.read()
                start = int(response.headers["X-Log-Start-Offset"])
                end = int(response.headers["X-Log-End-Offset"])
            return Fetched(scan_records(data, expected_offset=from_offset).records, start, end)

        return await self._on_a_server(attempt)

    async def offsets_for_time(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """Per partition, the first offset stamped at or after ``timestamp_ms`` (the end when none is)."""
        answer = await self.request("GET", f"/topics/{topic}/offsets", params={"timestamp_ms": timestamp_ms})
        return {int(p): int(o) for p, o in answer["offsets"].items()}

    async def topic_stats(self, topic: str) -> dict[str, Any]:
        return await self.request("GET", f"/topics/{topic}/stats")

    async def topic_readers(self, topic: str) -> dict[str, Any]:
        """Who reads the topic outside any group (Spark queries, by ``readerName``): offsets and lag."""
        return await self.request("GET", f"/topics/{topic}/readers")

    # --- consumer groups -----------------------------------------------------------------------------

    async def create_group(
        self,
        group: str,
        topic: str,
        *,
        partition_count: int | None = None,
        strategy: str = "round_robin",
        session_timeout_secs: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"topic": topic, "strategy": strategy}
        if partition_count is not None:
            body["partition_count"] = partition_count
        if session_timeout_secs is not None:
            body["session_timeout_secs"] = session_timeout_secs
        return await self.request("POST", f"/consumer-groups/{group}", body)

    async def delete_group(self, group: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/consumer-groups/{group}")

    async def join(
        self, group: str, *, member_id: str | None = None, session_timeout_secs: float | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if member_id is not None:
            body["member_id"] = member_id
        if session_timeout_secs is not None:
            body["session_timeout_secs"] = session_timeout_secs
        return await self._call(
            "group.join", {**body, "group": group}, "POST", f"/consumer-groups/{group}/join", body
        )

    async def assignment(self, group: str, member_id: str) -> dict[str, Any]:
        return await self._call(
            "group.assignment",
            {"group": group, "member_id": member_id},
            "GET",
            f"/consumer-groups/{group}/members/{member_id}/assignment",
        )

    async def heartbeat(self, group: str, member_id: str) -> dict[str, Any]:
        return await self._call(
            "group.heartbeat",
            {"group": group, "member_id": member_id},
            "POST",
            f"/consumer-groups/{group}/members/{member_id}/heartbeat",
        )

    async def leave(self, group: str, member_id: str) -> dict[str, Any]:
        return await self._call(
            "group.leave",
            {"group": group, "member_id": member_id},
            "DELETE",
            f"/consumer-groups/{group}/members/{member_id}/leave",
        )

    async def commit(
        self,
        group: str,
        partition: int,
        offset: int,
        *,
        member_id: str | None = None,
        generation: int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"partition_id": partition, "offset": offset}
        if member_id is not None:
            body["member_id"] = member_id
            body["generation"] = generation
        return await self._call(
            "group.commit", {**body, "group": group}, "POST", f"/consumer-groups/{group}/offsets/commit", body
        )

    async def committed(self, group: str, partition: int) -> int | None:
        answer = await self._call(
            "group.offset",
            {"group": group, "partition_id": partition},
            "GET",
            f"/consumer-groups/{group}/offsets/{partition}",
        )
        offset = answer["offset"]
        return None if offset is None else int(offset)

    async def group_stats(self, group: str) -> dict[str, Any]:
        return await self.request("GET", f"/consumer-groups/{group}/stats")
