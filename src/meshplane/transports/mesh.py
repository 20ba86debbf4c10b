"""The mesh transport: envelopes through the local mesh node (``DYN_EVENT_PLANE=mesh``,
``MESHPLANE_NODE``), on the subjects NATS uses and in the bytes NATS carries, so sequence, gap and
liveness tracking hold end to end across the mesh's nodes."""

from __future__ import annotations

from typing import Any

from meshplane.core.envelope import Codec, EventEnvelope
from meshplane.core.framing import HEARTBEAT_SUFFIX, MessageType, WireFormat, encode_nats
from meshplane.errors import TransportError
from meshplane.mesh.client import MeshClient
from meshplane.transports.base import PublisherTransport, Received, SubscriberTransport
from meshplane.transports.inbox import Inbox, decode_messages
from meshplane.transports.native import NativeNatsDecode, native_nats_decode

TRANSPORT_MESH = "Mesh"  # in discovery records (meshplane only; Dynamo has no such transport)


class MeshPublisherTransport(PublisherTransport):
    def __init__(
        self,
        client: MeshClient,
        subject: str,
        subject_prefix: str,
        wire: WireFormat,
        codec: Codec,
        *,
        guaranteed: bool = False,
    ) -> None:
        self._client = client
        self._guaranteed = guaranteed  # MESHPLANE_GUARANTEED: each publish waits until it is stored
        self._subject = subject
        self._subject_prefix = subject_prefix
        self._wire = wire
        self._codec = codec

    async def start(self) -> None:
        return None

    def discovery_transport(self) -> tuple[str, dict[str, Any]]:
        return TRANSPORT_MESH, {"subject_prefix": self._subject_prefix, "node": self._client.node}

    async def send(self, envelope: EventEnvelope) -> None:
        data = encode_nats(envelope, self._wire, self._codec)
        await self._client.publish(self._subject, data, guaranteed=self._guaranteed)

    async def send_heartbeat(self, envelope: EventEnvelope) -> None:
        data = encode_nats(envelope, self._wire, self._codec, MessageType.HEARTBEAT)
        dynamo = self._wire is WireFormat.DYNAMO
        await self._client.publish(self._subject + HEARTBEAT_SUFFIX if dynamo else self._subject, data)

    async def flush(self, timeout: float) -> None:
        try:
            await self._client.flush(timeout)
        except TransportError:
            raise
        except Exception as exc:
            raise TransportError(f"mesh flush failed: {exc!r}") from exc

    async def close(self) -> None:
        return None  # the connection belongs to the plane


class MeshSubscriberTransport(SubscriberTransport):
    announces = True

    def __init__(self, client: MeshClient, subject: str, max_bytes: int, pending_limit: int) -> None:
        self._client = client
        self._subject = subject
        self._routing_topic = subject.encode()
        self._max_bytes = max_bytes
        self._inbox = Inbox(pending_limit)
        self._sids: list[int] = []
        self._native: NativeNatsDecode | None = None

    @property
    def dropped(self) -> int:
        return self._inbox.dropped

    def _on_message(self, subject: str, body: bytes) -> None:
        self._inbox.put(body)

    async def start(self) -> None:
        self._native = native_nats_decode()
        for subject in (self._subject, self._subject + HEARTBEAT_SUFFIX):
            self._sids.append(self._client.subscribe(subject, self._on_message))
        # Every node of the cluster has the subscription: nothing published after it is missed.
        await self._client.flush(propagated=True)

    async def receive(self) -> list[Received]:
        batch = await self._inbox.take()
        if not self._sids:
            return []
        return decode_messages(batch, self._routing_topic, self._max_bytes, self._native)

    async def close(self) -> None:
        sids, self._sids = self._sids, []
        for sid in sids:
            self._client.unsubscribe(sid)
        self._inbox.wake()
