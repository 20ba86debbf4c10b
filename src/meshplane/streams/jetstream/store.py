"""The JetStream adapter: connection, partition streams, appends with acknowledgement, batched direct
reads, and the key-value buckets. No meshplane state lives here."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.kv import KeyValue

from meshplane.core.streamlog import Record
from meshplane.core.urls import redact_url
from meshplane.streams.errors import StorageError
from meshplane.streams.jetstream import naming
from meshplane.streams.jetstream.client import StoreClient

log = logging.getLogger(__name__)

# A read asks for at most this many messages at once (the server's direct-get batch limit is higher;
# a bounded batch keeps one reader from holding a reply queue of unbounded size).
MAX_BATCH = 1000

# The most messages an atomic batch may hold (nats-server's limit), and the error code of a stream
# that does not allow atomic batches.
ATOMIC_MAX = 1000
ATOMIC_DISABLED = 10174


class _AtomicDisabled(Exception):
    """The stream was made without ``allow_atomic``: nothing of the batch was stored."""


class Unavailable(StorageError):
    """JetStream did not answer (no leader, no quorum, or the servers are gone): a 503, try again."""


# What JetStream answers while a leader is elected or a server is gone: each is worth a retry.
ELECTION_ERRORS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.js.errors.NoStreamResponseError,  # "no response from stream": the stream has no leader yet
    nats.js.errors.ServiceUnavailableError,
)


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, TimeoutError) and not isinstance(exc, nats.errors.TimeoutError):
        return "no connection to any of the servers yet"
    if isinstance(exc, nats.errors.TimeoutError | nats.errors.NoRespondersError):
        return "no answer from JetStream (no leader yet, or not enabled)"
    return str(exc) or type(exc).__name__


@dataclass
class StreamBounds:
    """A partition's extent as JetStream last reported it: sequences start at 1, offsets at 0."""

    first_seq: int = 0
    last_seq: int = 0
    messages: int = 0
    bytes: int = 0

    @property
    def start_offset(self) -> int:
        return self.last_seq if self.messages == 0 else self.first_seq - 1

    @property
    def next_offset(self) -> int:
        return self.last_seq


#: How often start-up says it still waits for JetStream.
PROGRESS_EVERY = 5.0


class JetStreamStore:
    def __init__(
        self,
        servers: list[str],
        *,
        replicas: int = 1,
        timeout: float = 5.0,
        start_timeout: float = 60.0,
        progress: Callable[[str], None] = log.warning,
        names: naming.Naming = naming.DEFAULT_NAMING,
    ) -> None:
        self.naming = names  # the names of its VPN's streams, buckets and subjects
        self.servers = servers
        self.replicas = replicas
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.progress = progress
        self._connect_error: Exception | None = None
        self.nc: Client | None = None
        self._replies: dict[str, asyncio.Queue[Msg]] = {}
        self._reply_prefix = ""
        self._tokens = itertools.count()
        self._batch_prefix = secrets.token_hex(8)
        self._not_atomic: set[str] = set()  # subjects of streams that refused atomic batches

    async def connect(self, on_notice: Callable[[Msg], Awaitable[None]]) -> None:
        """Connect and open the buckets, waiting up to ``start_timeout`` for servers that are not up yet or
        a cluster that has no leader yet (saying so every few seconds), then failing in one line."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        said = started
        last: BaseException | None = None
        while True:
            try:  # each try within what is left: --storage-timeout 6 gives up after 6 s, not 11
                async with asyncio.timeout(max(0.1, started + self.start_timeout - loop.time())):
                    await self._open(on_notice)
                return
            except (*ELECTION_ERRORS, TimeoutError, OSError, nats.errors.NoServersError) as exc:
                last = self._connect_error if self.nc is None and self._connect_error else exc
            waited = loop.time() - started
            if waited >= self.start_timeout:
                raise Unavailable(
                    f"JetStream at {redact_url(','.join(self.servers))} did not answer within "
                    f"{self.start_timeout:.0f} s (last: {_reason(last)}); is nats-server running with -js, "
                    "and does its cluster have a quorum? (--storage-timeout waits longer)"
                )
            if loop.time() - said >= PROGRESS_EVERY:
                said = loop.time()
                self.progress(
                    f"waiting for JetStream at {redact_url(','.join(self.servers))}: {_reason(last)} "
                    f"({waited:.0f} s of {self.start_timeout:.0f} s)"
                )
            await asyncio.sleep(0.5)

    async def _open(self, on_notice: Callable[[Msg], Awaitable[None]]) -> None:
        if self.nc is None or not self.nc.is_connected:
            client = StoreClient()

            async def failed(exc: Exception) -> None:  # said in the progress lines and the error
                self._connect_error = exc

            try:  # nats-py retries a first connection forever itself: bound each try instead
                connecting = client.connect(
                    servers=self.servers,
                    error_cb=failed,
                    name="meshplane-streams",
                    connect_timeout=max(1, round(self.timeout)),
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.2,  # type: ignore[arg-type]  # seconds: nats-py takes a float
                )
                async with asyncio.timeout(PROGRESS_EVERY):
                    await connecting
            except BaseException:  # a try cut short must not leave a client reconnecting
                with contextlib.suppress(Exception):
                    await client.close()
                raise
            self.nc = client
            self.js = self.nc.jetstream(timeout=self.timeout)
            self._reply_prefix = self.nc.new_inbox()
            await self.nc.subscribe(self._reply_prefix + ".*", cb=self._on_reply)
            await self.nc.subscribe(self.naming.notices, cb=on_notice)
        self.topics_kv = await self._bucket(self.naming.topics_bucket)
        self.groups_kv = await self._bucket(self.naming.groups_bucket)
        self.rooms_kv = await self._bucket(self.naming.rooms_bucket)

    async def follow_rooms(self, on_event: Callable[[Msg], Awaitable[None]]) -> None:
        """Every room's events as its stream stores them (republished whole), for the rooms' views."""
        assert self.nc is not None
        await self.nc.subscribe(self.naming.room_feed, cb=on_event)

    async def _bucket(self, name: str) -> KeyValue:
        try:
            return await self.js.create_key_value(bucket=name, history=1, replicas=self.replicas)
        except nats.js.errors.BadRequestError:  # made already (perhaps with other settings): use it
            return await self.js.key_value(name)

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.drain()

    # --- streams -------------------------------------------------------------------------------------

    async def ensure_partition(
        self, topic: str, partition: int, limits: dict[str, Any], duplicate_window: float
    ) -> StreamBounds:
        return await self._ensure_stream(
            self.naming.partition_stream(topic, partition),
            self.naming.partition_subject(topic, partition),
            None,
            duplicate_window=duplicate_window,
            **limits,
        )

    async def ensure_room(self, room: str, max_events: int, retention_secs: float | None) -> StreamBounds:
        """A room's stream: it keeps what the room keeps, and republishes each event whole so that
        every server's view of the room follows it."""
        subject = self.naming.room_subject(room)
        return await self._ensure_stream(
            self.naming.room_stream(room),
            subject,
            api.RePublish(src=subject, dest=self.naming.room_feed_subject(room)),
            max_msgs=max_events,
            max_age=retention_secs or 0.0,
        )

    async def _ensure_stream(
        self, name: str, subject: str, republish: api.RePublish | None, **settings: Any
    ) -> StreamBounds:
        config = api.StreamConfig(
            name=name,
            subjects=[subject],
            num_replicas=self.replicas,
            allow_direct=True,
            allow_atomic=True,
            republish=republish,
            **settings,
        )
        self._not_atomic.discard(subject)
        try:
            info = await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:  # it exists with other limits: those set now win
            info = await self.js.update_stream(config)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise Unavailable(f"JetStream did not create stream {name}: {exc!r}") from None
        return _bounds(info.state)

    async def delete_partition(self, topic: str, partition: int) -> None:
        await self.delete_stream(self.naming.partition_stream(topic, partition))

    async def delete_stream(self, name: str) -> None:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_stream(name)

    async def bounds(self, topic: str, partition: int) -> StreamBounds:
        return await self.stream_bounds(self.naming.partition_stream(topic, partition))

    async def stream_bounds(self, stream: str) -> StreamBounds:
        try:
            info = await self.js.stream_info(stream)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise Unavailable(f"JetStream did not answer for {stream}: {exc!r}") from None
        return _bounds(info.state)

    async def append(
        self, topic: str, partition: int, payloads: list[bytes], timestamp_ms: int, ids: list[str] | None
    ) -> tuple[list[int], int]:
        """Append in order; the offsets once JetStream acknowledged each (stored on a quorum), and how
        many were duplicates (same message id within the window: the first one's offset). Then every
        server hears of the new end in one small notice (its waiting readers wake); a notice lost with
        a server that died is made up for by each server's periodic look at the stream."""
        appended = await self.publish(
            self.naming.partition_subject(topic, partition), payloads, timestamp_ms, ids
        )
        assert self.nc is not None
        with contextlib.suppress(nats.errors.Error):
            if appended[0]:
                notice = b"%d" % (max(appended[0]) + 1)
                await self.nc.publish(self.naming.notice_subject(topic, partition), notice)
        return appended

    async def publish(
        self, subject: str, payloads: list[bytes], timestamp_ms: int, ids: list[str] | None = None
    ) -> tuple[list[int], int]:
        if ids is None and subject not in self._not_atomic and self._atomic_supported():
            try:
                return await self._publish_atomic(subject, payloads, str(timestamp_ms)), 0
            except _AtomicDisabled:  # a stream made before atomic batches: message by message
                self._not_atomic.add(subject)
        return await self._publish_each(subject, payloads, timestamp_ms, ids)

    def _atomic_supported(self) -> bool:
        assert self.nc is not None
        version = self.nc.connected_server_version
        return (version.major, version.minor) >= (2, 12)

    async def _publish_atomic(self, subject: str, payloads: list[bytes], stamp: str) -> list[int]:
        """Atomic batches (nats-server 2.12+, ADR-50) of up to 1,000 messages, one acknowledgement
        each: stored whole or not at all, at consecutive sequences. Message ids cannot take part
        (a duplicate would fail the whole batch), so idempotent appends go message by message."""
        assert self.nc is not None
        chunks = [payloads[i : i + ATOMIC_MAX] for i in range(0, len(payloads), ATOMIC_MAX)]
        commits = []
        try:
            for chunk in chunks:
                batch_id = f"{self._batch_prefix}{next(self._tokens)}"
                headers = {naming.TIMESTAMP_HEADER: stamp, "Nats-Batch-Id": batch_id}
                for number, payload in enumerate(chunk[:-1], 1):
                    headers["Nats-Batch-Sequence"] = str(number)
                    await self.nc.publish(subject, payload, headers=headers)
                headers["Nats-Batch-Sequence"] = str(len(chunk))
                headers["Nats-Batch-Commit"] = "1"
                commits.append(
                    asyncio.ensure_future(
                        self.nc.request(subject, chunk[-1], timeout=self.timeout, headers=headers)
                    )
                )
            answers = await asyncio.gather(*commits)
        except (TimeoutError, *ELECTION_ERRORS) as exc:
            for commit in commits:
                commit.cancel()
            raise Unavailable(f"JetStream did not acknowledge an append to {subject} ({exc!r})") from exc
        offsets: list[int] = []
        for chunk, answer in zip(chunks, answers, strict=True):
            ack = json.loads(answer.data)
            error = ack.get("error")
            if error is not None:
                if error.get("err_code") == ATOMIC_DISABLED and not offsets:
                    raise _AtomicDisabled
                if error.get("code") == 503:
                    raise Unavailable(f"JetStream could not store an append to {subject}: {error}")
                raise StorageError(f"JetStream refused an append to {subject}: {error.get('description')}")
            if ack.get("count") != len(chunk):
                raise StorageError(f"JetStream answered an atomic batch of {len(chunk)} with {ack}")
            last = int(ack["seq"]) - 1
            offsets.extend(range(last - len(chunk) + 1, last + 1))
        return offsets

    async def _publish_each(
        self, subject: str, payloads: list[bytes], timestamp_ms: int, ids: list[str] | None
    ) -> tuple[list[int], int]:
        stamp = str(timestamp_ms)
        pending = []
        try:
            for i, payload in enumerate(payloads):
                headers = {naming.TIMESTAMP_HEADER: stamp}
                if ids is not None:
                    headers["Nats-Msg-Id"] = ids[i]
                pending.append(await self.js.publish_async(subject, payload, headers=headers))
            async with asyncio.timeout(self.timeout):
                acks = await asyncio.gather(*pending)
        except (TimeoutError, *ELECTION_ERRORS) as exc:
            for future in pending:
                future.cancel()
            raise Unavailable(f"JetStream did not acknowledge an append to {subject} ({exc!r})") from exc
        except nats.errors.Error as exc:  # any other: a refusal the client cannot fix by waiting
            for future in pending:
                future.cancel()
            raise StorageError(f"JetStream refused an append to {subject}: {exc}") from None
        return [ack.seq - 1 for ack in acks], sum(1 for ack in acks if ack.duplicate)

    async def read(
        self, topic: str, partition: int, from_offset: int, limit: int, max_bytes: int
    ) -> list[Record]:
        """Up to ``limit`` records from ``from_offset`` in one batched direct get (any replica
        answers; no consumer is created)."""
        return await self.read_stream(
            self.naming.partition_stream(topic, partition), from_offset, limit, max_bytes
        )

    async def read_stream(self, stream: str, from_offset: int, limit: int, max_bytes: int) -> list[Record]:
        assert self.nc is not None
        token = str(next(self._tokens))
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._replies[token] = queue
        request = {"seq": from_offset + 1, "batch": min(limit, MAX_BATCH), "max_bytes": max_bytes}
        records: list[Record] = []
        try:
            await self.nc.publish(
                f"$JS.API.DIRECT.GET.{stream}",
                json.dumps(request).encode(),
                reply=f"{self._reply_prefix}.{token}",
            )
            async with asyncio.timeout(self.timeout):
                while True:
                    msg = await queue.get()
                    headers = msg.headers or {}
                    status = headers.get("Status")
                    if status is not None:  # 204: end of the batch; 404: nothing at or after seq
                        if status in ("204", "404"):
                            return records
                        raise StorageError(
                            f"JetStream read of {stream}: {status} {headers.get('Description')}"
                        )
                    seq = int(headers["Nats-Sequence"])
                    stamp = int(headers.get(naming.TIMESTAMP_HEADER, "0"))
                    records.append(Record(seq - 1, stamp, msg.data, 0, len(msg.data)))
        except TimeoutError:
            raise Unavailable(f"JetStream did not answer a read of {stream}") from None
        finally:
            del self._replies[token]

    async def first_at_or_after(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The offset of the first message stored at or after ``timestamp_ms`` (JetStream's own stamp)."""
        from datetime import UTC, datetime

        when = datetime.fromtimestamp(timestamp_ms / 1000, UTC).isoformat().replace("+00:00", "Z")
        try:
            msg = await self.nc.request(  # type: ignore[union-attr]
                f"$JS.API.DIRECT.GET.{self.naming.partition_stream(topic, partition)}",
                json.dumps({"start_time": when}).encode(),
                timeout=self.timeout,
            )
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise Unavailable(f"JetStream did not answer for {topic}/{partition}: {exc!r}") from None
        headers = msg.headers or {}
        if "Nats-Sequence" not in headers:
            return None
        return int(headers["Nats-Sequence"]) - 1

    async def _on_reply(self, msg: Msg) -> None:
        queue = self._replies.get(msg.subject.rpartition(".")[2])
        if queue is not None:  # else the reader timed out and went
            queue.put_nowait(msg)


def _bounds(state: api.StreamState) -> StreamBounds:
    return StreamBounds(state.first_seq, state.last_seq, state.messages, state.bytes)
