"""``StreamsClient``: an async client for every operation of ``meshplane serve``.

>>> async with StreamsClient("http://127.0.0.1:15500") as client:
...     offset = await client.publish("chat", "message", {"text": "hi"})
...     async for event in client.subscribe("chat", from_offset=-50):
...         print(event["offset"], event["data"])
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import aiohttp

from meshplane.core.streamlog import Record, scan_records
from meshplane.streams.errors import StreamError, error_from_response


class Fetched(NamedTuple):
    records: list[Record]
    log_start_offset: int
    log_end_offset: int  # the next offset to be written


class StreamsClient:
    def __init__(
        self, url: str = "http://127.0.0.1:15500", *, token: str | None = None, timeout: float = 30.0
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout))

    async def __aenter__(self) -> StreamsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        async with self._session.request(method, self.url + path, json=body, params=query) as response:
            if response.status == 401:
                raise StreamError("401 Unauthorized: pass the server's token")
            data = await response.json(content_type=None) if response.content_length != 0 else {}
            if response.status >= 400:
                raise error_from_response(response.status, data)
            result: dict[str, Any] = data
            return result

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
        return int((await self.request("POST", f"/stream/{room}/publish", body))["offset"])

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
    ) -> AsyncIterator[dict[str, Any]]:
        """Events pushed over the room's WebSocket, from ``from_offset`` (None: only new ones)."""
        params = {} if from_offset is None else {"from_offset": str(from_offset)}
        ws_url = self.url.replace("http", "ws", 1) + f"/stream/{room}/ws/{subscriber_id}"
        async with self._session.ws_connect(ws_url, params=params) as ws:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                frame = json.loads(message.data)
                if frame.get("type") == "event":
                    yield frame
                elif frame.get("type") == "error":
                    raise StreamError(frame.get("error", "subscription failed"))

    # --- pub/sub -------------------------------------------------------------------------------------

    async def command(self, command: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The Synap command endpoint."""
        answer = await self.request("POST", "/api/v1/command", {"command": command, "payload": payload})
        if not answer.get("success"):
            raise StreamError(answer.get("error") or "command failed")
        result: dict[str, Any] = answer["payload"]
        return result

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
        key: str | None = None,
        partition: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> tuple[int, int]:
        body: dict[str, Any] = {"event_type": event_type, "data": data}
        for name, value in (("key", key), ("partition", partition), ("metadata", metadata)):
            if value is not None:
                body[name] = value
        answer = await self.request("POST", f"/topics/{topic}/publish", body)
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
        answer = await self.request("POST", f"/topics/{topic}/publish", body)
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
        url = f"{self.url}/topics/{topic}/partitions/{partition}/records"
        params = {"from_offset": str(from_offset), "max_bytes": str(max_bytes)}
        async with self._session.get(url, params=params) as response:
            if response.status >= 400:
                raise error_from_response(response.status, await response.json(content_type=None))
            data = await response.read()
            start = int(response.headers["X-Log-Start-Offset"])
            end = int(response.headers["X-Log-End-Offset"])
        records = scan_records(data, expected_offset=from_offset).records
        return Fetched(records, start, end)

    async def topic_stats(self, topic: str) -> dict[str, Any]:
        return await self.request("GET", f"/topics/{topic}/stats")

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
        return await self.request("POST", f"/consumer-groups/{group}/join", body)

    async def assignment(self, group: str, member_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/consumer-groups/{group}/members/{member_id}/assignment")

    async def heartbeat(self, group: str, member_id: str) -> dict[str, Any]:
        return await self.request("POST", f"/consumer-groups/{group}/members/{member_id}/heartbeat")

    async def leave(self, group: str, member_id: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/consumer-groups/{group}/members/{member_id}/leave")

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
        return await self.request("POST", f"/consumer-groups/{group}/offsets/commit", body)

    async def committed(self, group: str, partition: int) -> int | None:
        offset = (await self.request("GET", f"/consumer-groups/{group}/offsets/{partition}"))["offset"]
        return None if offset is None else int(offset)

    async def group_stats(self, group: str) -> dict[str, Any]:
        return await self.request("GET", f"/consumer-groups/{group}/stats")
