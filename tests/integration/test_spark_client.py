"""The Spark executors' HTTP client against a real `meshplane serve`: local reads of segment files."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshplane.core.streamlog import scan_records
from meshplane.launchers import StreamsServerProcess
from meshplane.spark.http import SyncStreamsClient, is_loopback
from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import OffsetOutOfRange, StreamError

TOKEN = "spark-client-token"
EVENTS = 600


@pytest.fixture(scope="module")
def server() -> Iterator[StreamsServerProcess]:
    # Small segments: reads cross many segment boundaries.
    with StreamsServerProcess(
        extra_args=("--segment-bytes", "8192"), env={"MESHPLANE_STREAMS_TOKEN": TOKEN}
    ) as proc:
        proc.start()

        async def publish() -> None:
            async with StreamsClient(proc.url, token=TOKEN) as client:
                await client.create_topic("t", 1)
                events = [{"event_type": "e", "key": f"k{i}", "data": "é" * (i % 50)} for i in range(EVENTS)]
                await client.publish_batch("t", events)

        asyncio.run(publish())
        yield proc


def chunks(client: SyncStreamsClient, max_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of every chunk from offset 0 to the end of partition 0."""
    offset = 0
    while offset < EVENTS:
        data, start, end = client.fetch_raw("t", 0, offset, max_bytes)
        assert (start, end) == (0, EVENTS)
        records = scan_records(bytes(data), start_position=0, max_records=EVENTS).records
        assert records, f"no whole record at offset {offset}"
        assert records[0].offset == offset
        yield offset, bytes(data)
        offset += len(records)


def open_files() -> set[Path]:
    """The files this process holds open."""
    found = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            found.add(Path(os.readlink(fd)))
    return found


def test_local_reads_return_what_http_sends(server: StreamsServerProcess) -> None:
    local = SyncStreamsClient(server.url, TOKEN, local_reads=True)
    remote = SyncStreamsClient(server.url, TOKEN, local_reads=False)
    try:
        for max_bytes in (1, 3000, 1 << 20):
            assert list(chunks(local, max_bytes)) == list(chunks(remote, max_bytes))
            # the local client read the segment itself: it holds the file open (HTTP would not)
            segments = {p.resolve() for p in (server.data_dir / "topics" / "t" / "0").glob("*.log")}
            assert segments & open_files(), "the local client did not read the segment file"
        assert local.fetch_raw("t", 0, EVENTS, 1000) == (b"", 0, EVENTS)  # past the end: nothing
        with pytest.raises(OffsetOutOfRange):
            local.fetch_raw("t", 0, EVENTS + 5, 1000)
    finally:
        local.close()
        remote.close()


def test_local_reads_need_the_token(server: StreamsServerProcess) -> None:
    anonymous = SyncStreamsClient(server.url, local_reads=True)
    with pytest.raises(StreamError, match="401"):
        anonymous.fetch_raw("t", 0, 0, 1000)
    anonymous.close()


def test_a_file_that_is_not_the_servers_sends_the_client_back_to_http(
    server: StreamsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same path, other file (another container's namesake): the inode differs, so HTTP from then on."""
    client = SyncStreamsClient(server.url, TOKEN, local_reads=True)
    over_http = SyncStreamsClient(server.url, TOKEN)
    expected = list(chunks(over_http, 3000))
    over_http.close()
    asked: list[str] = []
    answer = client.json

    def other_inode(method: str, path: str, body: Any = None) -> dict[str, Any]:
        where = answer(method, path, body)
        if path.split("?")[0].endswith("/location"):
            asked.append(path)
            where["inode"] += 1
        return where

    monkeypatch.setattr(client, "json", other_inode)
    assert list(chunks(client, 3000)) == expected
    assert len(asked) == 1  # asked once, then never again
    client.close()


def test_only_loopback_servers_are_read_locally() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.3.2.1", "::1", "localhost"]))
    assert not any(map(is_loopback, ["192.0.2.7", "10.0.0.1", "example.com", "::ffff:8.8.8.8"]))


def test_an_unreachable_server_is_retried_then_reported_in_one_line() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SyncStreamsClient(f"http://127.0.0.1:{port}", retry_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(StreamError, match=r"cannot reach the streams server .* \(retried for 0.5s\)"):
        client.bounds("t")
    assert 0.2 < time.monotonic() - started < 5  # it kept trying (backing off), within the limit


def test_a_503_is_retried_until_the_server_answers() -> None:
    answers = [503, 503, 200]
    served: list[int] = []

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = answers[min(len(served), len(answers) - 1)]
            served.append(status)
            body = b'{"partitions": []}' if status == 200 else b'{"error": "busy"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        client = SyncStreamsClient(f"http://127.0.0.1:{httpd.server_address[1]}", retry_timeout=10)
        try:
            assert client.bounds("t") == {}
        finally:
            client.close()
            httpd.shutdown()
    assert served == [503, 503, 200]
