"""A small synchronous client for Spark's driver and executors (they run plain Python, no event loop)."""

from __future__ import annotations

import http.client
import ipaddress
import itertools
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from meshplane.streams.errors import (
    UNAUTHORIZED,
    StreamError,
    Unauthorized,
    error_from_response,
    not_a_streams_server,
)

Body = TypeVar("Body", bytes, bytes | memoryview)
log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SyncStreamsClient:
    """Keep-alive HTTP to ``meshplane serve``; reconnects once when the server closed the connection.

    ``url`` may list several servers of the same streams (``meshplane serve --storage nats://``),
    comma-separated: when the current one cannot be reached, the next one is used.

    With ``local_reads`` and a server on this host (a loopback URL), :meth:`fetch_raw` asks the server
    where the records are and reads the segment file itself; when it cannot (another container, no
    permission, the file gone), it falls back to HTTP for the rest of this client's life.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 60.0,
        local_reads: bool = False,
        retry_timeout: float = 0.0,
        vpn: str | None = None,
    ) -> None:
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        for each in self.urls or [url]:
            parsed = urllib.parse.urlsplit(each)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise StreamError(f"url must look like http://host:port, not {each!r}")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        if vpn:  # an operator's requests in another Message VPN
            self._headers["X-Meshplane-Vpn"] = vpn
        self._timeout = timeout
        self._retry_timeout = retry_timeout
        self._conn: http.client.HTTPConnection | None = None
        self._fetch_buffer = bytearray()  # reused by fetch_raw: no fresh pages (and faults) per chunk
        self._wants_local_reads = local_reads
        self._segment: tuple[str, int] | None = None  # (path, fd) of the segment file open for local reads
        self._use(0)

    def _use(self, index: int) -> None:
        """Talk to ``self.urls[index]`` from now on."""
        self.close()
        self._index, self.url = index, self.urls[index]
        parsed = urllib.parse.urlsplit(self.url)
        assert parsed.hostname is not None
        self._host, self._port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
        self._https = parsed.scheme == "https"
        self._local_reads = self._wants_local_reads and is_loopback(self._host)

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
        deadline = time.monotonic() + self._retry_timeout
        delay = 0.05
        others_tried = 0
        for attempt in itertools.count():
            conn = self._connection()
            try:
                conn.request(method, path, payload, headers)
                response = conn.getresponse()
                data = read(response)
                if response.status != 503 or time.monotonic() + delay > deadline:
                    return response.status, {k.lower(): v for k, v in response.getheaders()}, data
                problem = f"503 {bytes(data[:200]).decode(errors='replace')}"
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                self.close()
                if attempt == 0:
                    continue  # the server closed a kept-alive connection: once more at once
                if others_tried < len(self.urls) - 1:  # another server of the same streams: go on there
                    others_tried += 1
                    log.warning("streams server at %s: %s; trying the next one", self.url, exc)
                    self._use((self._index + 1) % len(self.urls))
                    continue
                if time.monotonic() + delay > deadline:
                    waited = f" (retried for {self._retry_timeout:g}s)" if self._retry_timeout else ""
                    raise StreamError(
                        f"cannot reach the streams server at {self.url}{waited}: {exc}"
                    ) from None
                problem = str(exc)
            if attempt <= 1:
                log.warning(
                    "streams server at %s: %s; retrying for up to %gs", self.url, problem, self._retry_timeout
                )
            time.sleep(delay)  # transient (a restart, a full disk being cleared): back off, try again
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    def _buffer(self, length: int) -> memoryview:
        if len(self._fetch_buffer) < length:
            self._fetch_buffer = bytearray(length)  # a new one: the caller may still hold a view of the old
        return memoryview(self._fetch_buffer)[:length]

    def _read_into_buffer(self, response: http.client.HTTPResponse) -> bytes | memoryview:
        """The body, read straight into the reused buffer (error bodies and unknown lengths: bytes)."""
        length = response.length
        if length is None or response.status != 200:
            return response.read()
        view = self._buffer(length)
        if response.readinto(view) != length:
            raise http.client.IncompleteRead(bytes(view), length)
        return view

    def json(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        status, _, data = self.request(method, path, body)
        if status == 401:
            raise Unauthorized(UNAUTHORIZED)
        try:
            answer: dict[str, Any] = json.loads(data) if data else {}
        except ValueError:
            raise StreamError(not_a_streams_server(self.url, status)) from None
        if status >= 400:
            raise error_from_response(status, answer)
        return answer

    def bounds(self, topic: str) -> dict[str, tuple[int, int]]:
        """partition -> (oldest retained offset, next offset to be written)."""
        stats = self.json("GET", f"/topics/{urllib.parse.quote(topic)}/stats")
        return {
            str(p["partition_id"]): (int(p["min_offset"]), int(p["next_offset"])) for p in stats["partitions"]
        }

    def offsets_for_time(self, topic: str, timestamp_ms: int) -> dict[str, int]:
        """partition -> the first offset stamped at or after ``timestamp_ms`` (the end when none is)."""
        path = f"/topics/{urllib.parse.quote(topic)}/offsets?timestamp_ms={timestamp_ms}"
        return {str(p): int(o) for p, o in self.json("GET", path)["offsets"].items()}

    def fetch_raw(
        self, topic: str, partition: int, from_offset: int, max_bytes: int
    ) -> tuple[bytes | memoryview, int, int]:
        """Record bytes from ``from_offset`` (the last may be cut); with the log's start and end offsets.

        The bytes live in a buffer the next call reuses: decode them before fetching again.
        """
        path = f"/topics/{urllib.parse.quote(topic)}/partitions/{partition}/records"
        query = urllib.parse.urlencode({"from_offset": from_offset, "max_bytes": max_bytes})
        if self._local_reads:
            where = self.json("GET", f"{path}/location?{query}")
            read = self._read_segment(where)
            if read is not None:
                return read, int(where["log_start_offset"]), int(where["log_end_offset"])
        status, headers, data = self._exchange("GET", f"{path}?{query}", None, self._read_into_buffer)
        if status >= 400:
            raise error_from_response(status, json.loads(bytes(data)) if data else {})
        return data, int(headers["x-log-start-offset"]), int(headers["x-log-end-offset"])

    def _read_segment(self, where: dict[str, Any]) -> bytes | memoryview | None:
        """The bytes ``where`` points at, read from the segment file; None (and HTTP from now on) when
        the server keeps no files (JetStream storage), or the file cannot be opened, is not the
        server's (device and inode differ) or comes up short."""
        fd = None
        if where.get("local", True):
            if "path" not in where:
                return b""  # nothing at or after the offset
            fd = self._open_segment(where)
        if fd is not None:
            view = self._buffer(int(where["length"]))
            if os.preadv(fd, [view], int(where["position"])) == len(view):
                return view
        log.info("reading %s over HTTP from now on: no segment file is readable here", self.url)
        self._local_reads = False
        self._close_segment()
        return None

    def _open_segment(self, where: dict[str, Any]) -> int | None:
        path = str(where["path"])
        if self._segment is not None and self._segment[0] == path:
            return self._segment[1]
        self._close_segment()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino) != (where["device"], where["inode"]):
            os.close(fd)
            return None
        self._segment = (path, fd)
        return fd

    def _close_segment(self) -> None:
        if self._segment is not None:
            os.close(self._segment[1])
            self._segment = None

    def publish_batch(
        self,
        topic: str,
        events: list[dict[str, Any]],
        idempotency_key: str | None,
        partition: int | None = None,
    ) -> None:
        body: dict[str, Any] = {"events": events}
        if partition is not None:
            body["partition"] = partition
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        self.json("POST", f"/topics/{urllib.parse.quote(topic)}/publish", body)

    def stage(self, topic: str, stage: str, seq: int, events: list[dict[str, Any]]) -> None:
        """Chunk ``seq`` of a task attempt's rows, kept by the server until the commit names it."""
        body = {"stage": stage, "seq": seq, "events": events}
        self.json("POST", f"/topics/{urllib.parse.quote(topic)}/staged", body)

    def commit_staged(self, topic: str, key: str, stages: list[dict[str, Any]]) -> bool:
        """Append exactly these stages' events ({stage, chunks, events} each), once per ``key``;
        False when ``key`` had been committed before."""
        body = {"idempotency_key": key, "stages": stages}
        return bool(
            self.json("POST", f"/topics/{urllib.parse.quote(topic)}/staged/commit", body)["committed"]
        )

    def abort_staged(self, topic: str, stages: list[str]) -> None:
        self.json("POST", f"/topics/{urllib.parse.quote(topic)}/staged/abort", {"stages": stages})

    def close(self) -> None:
        self._close_segment()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
