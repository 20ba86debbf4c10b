"""NATS core transport (nats-py): a subject per scope and topic, the envelope or an 8-byte-header frame."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import HEARTBEAT_SUFFIX, MessageType, WireFormat, encode_nats
from meshplane.core.records import TRANSPORT_NATS
from meshplane.errors import TransportAuthError, TransportError
from meshplane.transports.base import PublisherTransport, Received, SubscriberTransport
from meshplane.transports.inbox import Inbox, decode_messages

log = logging.getLogger(__name__)


async def connect_nats(
    url: str, timeout: float, name: str = "meshplane", tls: ssl.SSLContext | None = None
) -> NatsClient:
    """Connect, retrying until ``timeout``; once connected, reconnect forever after outages.

    ``tls``: a TLS context (a tls:// URL alone uses the system's CAs)."""
    safe_url = redact_url(url)
    client = NatsClient()
    refused: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        if "authorization" in str(exc).lower() or "authentication" in str(exc).lower():
            refused.append(exc)
        log.warning("NATS %s: %s", safe_url, exc)

    async def on_disconnect() -> None:
        if not (client.is_closed or client.is_draining):
            log.warning("disconnected from NATS %s; reconnecting", safe_url)

    async def on_reconnect() -> None:
        log.info("reconnected to NATS %s", safe_url)

    try:
        # nats-py retries the first connection on its own (max_reconnect_attempts=-1 applies to it too),
        # so bound the whole attempt instead of looping around it.
        await asyncio.wait_for(
            client.connect(
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
            ),
            timeout,
        )
    except Exception as exc:
        with contextlib.suppress(Exception):
            await client.close()
        if refused:
            raise TransportAuthError(
                f"NATS at {safe_url} refused the credentials ({refused[-1]}); check the user, password "
                "or token in NATS_SERVER"
            ) from exc
        raise TransportError(
            f"cannot connect to NATS at {redact_url(url)} within {timeout}s ({type(exc).__name__}); "
            "start nats-server or point NATS_SERVER at one"
        ) from exc
    return client


def redact_url(url: str) -> str:
    """The URL (or comma-separated URLs) without credentials, for messages and logs."""
    if "," in url:
        return ",".join(redact_url(one.strip()) for one in url.split(","))
    parts = urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=f"***@{netloc}"))
    return url


class NatsPublisherTransport(PublisherTransport):
    def __init__(
        self, client: NatsClient, subject: str, subject_prefix: str, wire: WireFormat, codec: Codec
    ) -> None:
        self._client = client
        self._subject = subject
        self._subject_prefix = subject_prefix
        self._wire = wire
        self._codec = codec

    async def start(self) -> None:
        return None

    def discovery_transport(self) -> tuple[str, dict[str, Any]]:
        return TRANSPORT_NATS, {"subject_prefix": self._subject_prefix}

    async def send(self, envelope: EventEnvelope) -> None:
        # nats-py only appends to its write buffer here; its flusher task writes in batches.
        await self._client.publish(self._subject, encode_nats(envelope, self._wire, self._codec))

    async def send_heartbeat(self, envelope: EventEnvelope) -> None:
        data = encode_nats(envelope, self._wire, self._codec, MessageType.HEARTBEAT)
        dynamo = self._wire is WireFormat.DYNAMO
        await self._client.publish(self._subject + HEARTBEAT_SUFFIX if dynamo else self._subject, data)

    async def flush(self, timeout: float) -> None:
        try:
            await self._client.flush(timeout=max(1, int(timeout)))
        except Exception as exc:
            raise TransportError(f"NATS flush failed: {exc!r}") from exc

    async def close(self) -> None:
        return None  # the connection belongs to the plane


class NatsSubscriberTransport(SubscriberTransport):
    announces = True

    def __init__(self, client: NatsClient, subject: str, max_bytes: int, pending_limit: int) -> None:
        self._client = client
        self._subject = subject
        self._routing_topic = subject.encode()
        self._max_bytes = max_bytes
        self._pending_limit = pending_limit
        self._inbox = Inbox(pending_limit)
        self._subs: list[Any] = []

    @property
    def dropped(self) -> int:
        return self._inbox.dropped

    async def _on_message(self, msg: Msg) -> None:
        self._inbox.put(msg.data)

    async def start(self) -> None:
        # Dynamo-layout heartbeats come on a subject of their own, so Dynamo subscribers never see them.
        for subject in (self._subject, self._subject + HEARTBEAT_SUFFIX):
            self._subs.append(
                await self._client.subscribe(
                    subject, cb=self._on_message, pending_msgs_limit=self._pending_limit
                )
            )
        # Once the server has the subscription, nothing published afterwards is missed.
        await self._client.flush()

    async def receive(self) -> list[Received]:
        batch = await self._inbox.take()
        if not self._subs:
            return []  # closed
        return decode_messages(batch, self._routing_topic, self._max_bytes)

    async def close(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception as exc:
                log.debug("unsubscribe from %s failed: %s", self._subject, exc)
        self._inbox.wake()  # a pending receive() returns
