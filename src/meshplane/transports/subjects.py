"""What the NATS and mesh transports share: envelopes go as NATS-encoded bytes on the topic's
subject; in Dynamo's layout heartbeats go on a subject of their own (``<subject>/__heartbeat__``), so
Dynamo subscribers never see them; a subscriber listens on both and decodes what its inbox holds."""

from __future__ import annotations

from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import HEARTBEAT_SUFFIX, MessageType, WireFormat, encode_nats
from meshplane.transports.base import PublisherTransport, Received, SubscriberTransport
from meshplane.transports.inbox import Inbox, decode_messages
from meshplane.transports.native import NativeNatsDecode, expected_envelope, native_nats_decode


class SubjectPublisher(PublisherTransport):
    """Sends on a subject through a connection the plane owns; subclasses say how (``_publish``)."""

    def __init__(self, subject: str, subject_prefix: str, wire: WireFormat, codec: Codec) -> None:
        self._subject = subject
        self._subject_prefix = subject_prefix
        self._wire = wire
        self._codec = codec
        self._heartbeat_subject = subject + HEARTBEAT_SUFFIX if wire is WireFormat.DYNAMO else subject

    async def start(self) -> None:
        return None

    async def send(self, envelope: EventEnvelope) -> None:
        await self._publish(self._subject, encode_nats(envelope, self._wire, self._codec), heartbeat=False)

    async def send_heartbeat(self, envelope: EventEnvelope) -> None:
        data = encode_nats(envelope, self._wire, self._codec, MessageType.HEARTBEAT)
        await self._publish(self._heartbeat_subject, data, heartbeat=True)

    async def _publish(self, subject: str, data: bytes, *, heartbeat: bool) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        return None  # the connection belongs to the plane


class SubjectSubscriber(SubscriberTransport):
    """Listens on the subject and its heartbeat subject (``subjects``); messages go to an inbox,
    bounded, and come out decoded in batches. Subclasses subscribe and say whether they still are."""

    announces = True

    def __init__(self, subject: str, max_bytes: int, pending_limit: int, envelope_topic: str | None) -> None:
        self._subject = subject
        self._routing_topic = subject.encode()
        self._max_bytes = max_bytes
        self._inbox = Inbox(pending_limit)
        self._native: NativeNatsDecode | None = None
        # what the compiled decoder reads itself and vouches for as runs (batch_run)
        self._expected = None if envelope_topic is None else expected_envelope(envelope_topic)

    @property
    def subjects(self) -> tuple[str, str]:
        return self._subject, self._subject + HEARTBEAT_SUFFIX

    @property
    def drops(self) -> dict[str, int]:
        return {"queue_full": self._inbox.dropped}

    def unread(self) -> bool:
        return len(self._inbox) > 0

    @property
    def subscribed(self) -> bool:
        raise NotImplementedError

    async def start(self) -> None:
        self._native = native_nats_decode()

    async def receive(self) -> list[Received]:
        batch = await self._inbox.take()
        if not self.subscribed:
            return []  # closed
        decoded, self.batch_run = decode_messages(
            batch, self._routing_topic, self._max_bytes, self._native, self._expected
        )
        return decoded
