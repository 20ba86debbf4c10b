"""The mesh transport: envelopes through the local mesh node (``DYN_EVENT_PLANE=mesh``,
``MESHPLANE_NODE``), on the subjects NATS uses and in the bytes NATS carries, so sequence, gap and
liveness tracking hold end to end across the mesh's nodes."""

from __future__ import annotations

from typing import Any

from meshplane.core.envelope import Codec
from meshplane.core.framing import WireFormat
from meshplane.errors import TransportError
from meshplane.mesh.client import MeshClient
from meshplane.transports.subjects import SubjectPublisher, SubjectSubscriber

TRANSPORT_MESH = "Mesh"  # in discovery records (meshplane only; Dynamo has no such transport)


class MeshPublisherTransport(SubjectPublisher):
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
        super().__init__(subject, subject_prefix, wire, codec)
        self._client = client
        self._guaranteed = guaranteed  # MESHPLANE_GUARANTEED: each publish waits until it is stored

    def discovery_transport(self) -> tuple[str, dict[str, Any]]:
        return TRANSPORT_MESH, {"subject_prefix": self._subject_prefix, "node": self._client.node}

    async def _publish(self, subject: str, data: bytes, *, heartbeat: bool) -> None:
        await self._client.publish(subject, data, guaranteed=self._guaranteed and not heartbeat)

    async def flush(self, timeout: float) -> None:
        try:
            await self._client.flush(timeout)
        except TransportError:
            raise
        except Exception as exc:
            raise TransportError(f"mesh flush failed: {exc!r}") from exc


class MeshSubscriberTransport(SubjectSubscriber):
    def __init__(
        self,
        client: MeshClient,
        subject: str,
        max_bytes: int,
        pending_limit: int,
        envelope_topic: str | None = None,
    ) -> None:
        super().__init__(subject, max_bytes, pending_limit, envelope_topic)
        self._client = client
        self._sids: list[int] = []

    @property
    def subscribed(self) -> bool:
        return bool(self._sids)

    def _on_message(self, subject: str, body: bytes) -> None:
        self._inbox.put(body)

    async def start(self) -> None:
        await super().start()
        for subject in self.subjects:
            self._sids.append(self._client.subscribe(subject, self._on_message))
        # Every node of the cluster has the subscription: nothing published after it is missed.
        await self._client.flush(propagated=True)

    async def close(self) -> None:
        sids, self._sids = self._sids, []
        for sid in sids:
            self._client.unsubscribe(sid)
        self._inbox.wake()
