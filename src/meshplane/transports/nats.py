"""NATS core transport (nats-py): a subject per scope and topic, the envelope or an 8-byte-header frame."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import weakref
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import SlowConsumerError

from meshplane.aio import cancel_and_wait
from meshplane.core.envelope import Codec
from meshplane.core.framing import WireFormat
from meshplane.core.records import TRANSPORT_NATS
from meshplane.core.urls import redact_url
from meshplane.errors import TransportAuthError, TransportError
from meshplane.transports.inbox import MAX_BATCH
from meshplane.transports.subjects import SubjectPublisher, SubjectSubscriber

log = logging.getLogger(__name__)


class SlowConsumers:
    """Where nats-py's slow-consumer errors go: nats-py drops a message a subscription has no room
    for and tells only the connection's error callback; this counts each drop for its subscription."""

    def __init__(self) -> None:
        self._counters: dict[int, Callable[[], None]] = {}
        self.total = 0

    def register(self, sid: int, count: Callable[[], None]) -> None:
        self._counters[sid] = count

    def unregister(self, sid: int) -> None:
        self._counters.pop(sid, None)

    def dropped(self, sid: int) -> int:
        """Count one drop of subscription ``sid``; returns the connection's drops so far."""
        count = self._counters.get(sid)
        if count is not None:
            count()
        self.total += 1
        return self.total


_SLOW_CONSUMERS: weakref.WeakKeyDictionary[NatsClient, SlowConsumers] = weakref.WeakKeyDictionary()


def slow_consumers(client: NatsClient) -> SlowConsumers:
    """The slow-consumer counters of ``client`` (made by :func:`connect_nats`, or made now)."""
    return _SLOW_CONSUMERS.setdefault(client, SlowConsumers())


async def connect_nats(
    url: str, timeout: float, name: str = "meshplane", tls: ssl.SSLContext | None = None
) -> NatsClient:
    """Connect, retrying until ``timeout``; once connected, reconnect forever after outages.

    ``tls``: a TLS context (a tls:// URL alone uses the system's CAs)."""
    safe_url = redact_url(url)
    client = NatsClient()
    slow = slow_consumers(client)
    refused: list[Exception] = []
    failures: list[Exception] = []  # before the first connection: said once, in the error raised

    async def on_error(exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):  # one per dropped message: counted, logged once in a while
            drops = slow.dropped(exc.sid)
            if drops == 1 or drops % 10_000 == 0:
                log.warning("NATS %s: %d messages dropped for slow consumers (%s)", safe_url, drops, exc)
            return
        if "authorization" in str(exc).lower() or "authentication" in str(exc).lower():
            refused.append(exc)
        if client.is_connected or client.is_reconnecting:
            log.warning("NATS %s: %s", safe_url, exc)
        else:
            failures[:] = [exc]
            log.debug("NATS %s: %s", safe_url, exc)

    async def on_disconnect() -> None:
        if not (client.is_closed or client.is_draining):
            log.warning("disconnected from NATS %s; reconnecting", safe_url)

    async def on_reconnect() -> None:
        log.info("reconnected to NATS %s", safe_url)

    try:
        # nats-py retries the first connection on its own (max_reconnect_attempts=-1 applies to it too),
        # so bound the whole attempt instead of looping around it.
        async with asyncio.timeout(timeout):
            await client.connect(
                [server.strip() for server in url.split(",")],  # a cluster's nodes, as the Go client takes
                name=name,
                connect_timeout=max(1, int(timeout)),
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=1,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                tls=tls,
            )
    except Exception as exc:
        with contextlib.suppress(Exception):
            await client.close()
        if refused:
            raise TransportAuthError(
                f"NATS at {safe_url} refused the credentials ({refused[-1]}); check the user, password "
                "or token in NATS_SERVER"
            ) from exc
        why = str(failures[-1]) if failures else type(exc).__name__
        raise TransportError(
            f"cannot connect to NATS at {safe_url} within {timeout}s ({why}); "
            "start nats-server or point NATS_SERVER at one"
        ) from exc
    return client


async def flush_in_order(client: NatsClient, timeout: float) -> None:
    """Return once the server has every command sent before the call (SUB, PUB): what a flush means.

    nats-py (2.16) writes a flush's PING straight to the socket, ahead of the commands still queued for
    its flusher task, so its PONG alone can come back before they reached the server. A PING sent while
    nothing is queued follows them all; until then each flush wakes the flusher and waits a round trip.
    Commands queued meanwhile by other tasks can keep the queue from emptying: at ``timeout`` the last
    flush is the one that counts.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        behind_nothing = client.pending_data_size == 0
        await client.flush(timeout=max(1, int(timeout)))
        if behind_nothing or asyncio.get_running_loop().time() >= deadline:
            return


class NatsPublisherTransport(SubjectPublisher):
    def __init__(
        self, client: NatsClient, subject: str, subject_prefix: str, wire: WireFormat, codec: Codec
    ) -> None:
        super().__init__(subject, subject_prefix, wire, codec)
        self._client = client

    def discovery_transport(self) -> tuple[str, dict[str, Any]]:
        return TRANSPORT_NATS, {"subject_prefix": self._subject_prefix}

    async def _publish(self, subject: str, data: bytes, *, heartbeat: bool) -> None:
        # nats-py only appends to its write buffer here; its flusher task writes in batches.
        await self._client.publish(subject, data)

    async def flush(self, timeout: float) -> None:
        try:
            await flush_in_order(self._client, timeout)
        except Exception as exc:
            raise TransportError(f"NATS flush failed: {exc!r}") from exc


def _pending_queue(subscription: Any) -> asyncio.Queue[Msg] | None:
    """The queue nats-py fills for a subscription without a callback, where this nats-py has one."""
    queue = getattr(subscription, "_pending_queue", None)
    ok = isinstance(queue, asyncio.Queue) and isinstance(getattr(subscription, "_pending_size", None), int)
    return queue if ok else None


class NatsSubscriberTransport(SubjectSubscriber):
    """Subscribes to the topic's subject (and the Dynamo heartbeats' subject).

    nats-py hands a callback one message at a time, each through its queue, a coroutine and a task
    step; instead the subscriptions have no callback and a task per subscription drains nats-py's
    queue in bulk (one await per batch) into the inbox. nats-py's byte count of pending messages is
    kept as its own task would. With a nats-py that does not have that queue, it falls back to the
    callback.
    """

    def __init__(
        self,
        client: NatsClient,
        subject: str,
        max_bytes: int,
        pending_limit: int,
        envelope_topic: str | None = None,
    ) -> None:
        super().__init__(subject, max_bytes, pending_limit, envelope_topic)
        self._client = client
        self._pending_limit = pending_limit
        self._subs: list[Any] = []
        self._drains: list[asyncio.Task[None]] = []
        self._slow_consumers = slow_consumers(client)
        self.slow_dropped = 0  # messages nats-py dropped for want of room in a subscription's queue

    @property
    def subscribed(self) -> bool:
        return bool(self._subs)

    @property
    def drops(self) -> dict[str, int]:
        return {**super().drops, "slow_consumer": self.slow_dropped}

    def _count_slow(self) -> None:
        self.slow_dropped += 1

    @property
    def drains_in_bulk(self) -> bool:
        """Whether messages are taken from nats-py's queue in bulk (not one callback each)."""
        return bool(self._drains)

    async def _on_message(self, msg: Msg) -> None:
        self._inbox.put(msg.data)

    async def _drain(self, subscription: Any, queue: asyncio.Queue[Msg]) -> None:
        get, put_many = queue.get_nowait, self._inbox.put_many
        while True:
            batch = [(await queue.get()).data]
            with contextlib.suppress(asyncio.QueueEmpty):
                while len(batch) < MAX_BATCH:
                    batch.append(get().data)
            subscription._pending_size -= sum(map(len, batch))
            for _ in batch:
                queue.task_done()  # what nats-py's drain() waits for
            put_many(batch)

    async def start(self) -> None:
        await super().start()
        for subject in self.subjects:
            subscription = await self._client.subscribe(subject, pending_msgs_limit=self._pending_limit)
            queue = _pending_queue(subscription)
            if queue is None:  # another nats-py: its callback, one message at a time
                await subscription.unsubscribe()
                subscription = await self._client.subscribe(
                    subject, cb=self._on_message, pending_msgs_limit=self._pending_limit
                )
            else:
                self._drains.append(
                    asyncio.create_task(self._drain(subscription, queue), name=f"meshplane-nats-{subject}")
                )
            self._subs.append(subscription)
            self._slow_consumers.register(subscription._id, self._count_slow)
        # Once the server has the subscription, nothing published afterwards is missed.
        await flush_in_order(self._client, 10)

    async def close(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            self._slow_consumers.unregister(sub._id)
            try:
                await sub.unsubscribe()
            except Exception as exc:
                log.debug("unsubscribe from %s failed: %s", self._subject, exc)
        drains, self._drains = self._drains, []
        for drain in drains:
            await cancel_and_wait(drain)
        self._inbox.wake()  # a pending receive() returns
