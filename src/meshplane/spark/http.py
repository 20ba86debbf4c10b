"""A small synchronous client for Spark's driver and executors (they run plain Python, no event loop)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from meshplane.streams.errors import StreamError, error_from_response

Body = TypeVar("Body", bytes, bytes | memoryview)


class SyncStreamsClient:
    """Keep-alive HTTP to ``meshplane serve``; reconnects once when the server closed the connection."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise StreamError(f"url must look like http://host:port, not {url!r}")
        self.url = url
        self._host, self._port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
        self._https = parsed.scheme == "https"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._fetch_buffer = bytearray()  # reused by fetch_raw: no fresh pages (and faults) per chunk

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self._timeout)
        return self._conn

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        return self._exchange(method, path, body, http.client.HTTPResponse.read)

    def _exchange(
        self, method: str, path: str, body: Any, read: Callable[[http.client.HTTPResponse], Body]
    ) -> tuple[int, dict[str, str], Body]:
        payload = None if body is None else json.dumps(body).encode()
        headers = dict(self._headers)
        if payload is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, payload, headers)
                response = conn.getresponse()
                data = read(response)
                return response.status, {k.lower(): v for k, v in response.getheaders()}, data
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                self.close()
                if attempt:
                    raise StreamError(f"cannot reach the streams server at {self.url}: {exc}") from None
        raise AssertionError("unreachable")

    def _read_into_buffer(self, response: http.client.HTTPResponse) -> bytes | memoryview:
        """The body, read straight into the reused buffer (error bodies and unknown lengths: bytes)."""
        length = response.length
        if length is None or response.status != 200:
            return response.read()
        if len(self._fetch_buffer) < length:
            self._fetch_buffer = bytearray(length)  # a new one: the caller may still hold a view of the old
        view = memoryview(self._fetch_buffer)[:length]
        if response.readinto(view) != length:
            raise http.client.IncompleteRead(bytes(view), length)
        return view

    def json(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        status, _, data = self.request(method, path, body)
        answer: dict[str, Any] = json.loads(data) if data else {}
        if status == 401:
            raise StreamError("401 Unauthorized: set the token option")
        if status >= 400:
            raise error_from_response(status, answer)
        return answer

    def bounds(self, topic: str) -> dict[str, tuple[int, int]]:
        """partition -> (oldest retained offset, next offset to be written)."""
        stats = self.json("GET", f"/topics/{urllib.parse.quote(topic)}/stats")
        return {
            str(p["partition_id"]): (int(p["min_offset"]), int(p["next_offset"])) for p in stats["partitions"]
        }

    def fetch_raw(
        self, topic: str, partition: int, from_offset: int, max_bytes: int
    ) -> tuple[bytes | memoryview, int, int]:
        """Record bytes from ``from_offset`` (the last may be cut); with the log's start and end offsets.

        The bytes live in a buffer the next call reuses: decode them before fetching again.
        """
        query = urllib.parse.urlencode({"from_offset": from_offset, "max_bytes": max_bytes})
        status, headers, data = self._exchange(
            "GET",
            f"/topics/{urllib.parse.quote(topic)}/partitions/{partition}/records?{query}",
            None,
            self._read_into_buffer,
        )
        if status >= 400:
            raise error_from_response(status, json.loads(bytes(data)) if data else {})
        return data, int(headers["x-log-start-offset"]), int(headers["x-log-end-offset"])

    def publish_batch(self, topic: str, events: list[dict[str, Any]], idempotency_key: str | None) -> None:
        body: dict[str, Any] = {"events": events}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        self.json("POST", f"/topics/{urllib.parse.quote(topic)}/publish", body)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
