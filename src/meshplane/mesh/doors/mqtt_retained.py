"""The MQTT door's retained messages: the last retained PUBLISH of each topic, bounded.

Each node with an MQTT door keeps its own copy. A retained PUBLISH is stored on its node and sent to
the others as a direct event on ``$mqtt.<subject>`` (reserved: no client of the mesh sees it), which
every door subscribes to, so an MQTT client subscribing on any node gets it. The copy is in memory and
reaches the nodes that are up: a node started (or restarted) later knows only what was retained after.
Bounded (:data:`MAX_RETAINED`, :data:`MAX_RETAINED_BYTES`), each VPN to its share of them: a new topic
past its VPN's share is not retained, counted per VPN; an empty retained payload deletes the topic's
message, as MQTT says.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_topics import RETAIN_PREFIX, matches, to_topic
from meshplane.core.mesh.vpn import outward, vpn_of
from meshplane.mesh.doors.mqtt_filters import qos_for
from meshplane.mesh.preauth import QuietLog

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt import MqttDoor
    from meshplane.mesh.doors.mqtt_connection import MqttConnection
    from meshplane.mesh.holders import MeshEvent

log = logging.getLogger(__name__)

MAX_RETAINED = 10_000  # topics with a retained message, per node
MAX_RETAINED_BYTES = 64 * 1024 * 1024
RETAINED_SLICE = 256  # retained messages looked at per turn of the loop


@dataclass(slots=True)
class Retained:
    payload: bytes
    qos: int


class RetainedStore:
    """The node's retained messages, each VPN's in its own share of the pool: the node's bounds divided
    by its VPNs (``vpns()``: their number, read at each PUBLISH, so a reload changes the shares), so a
    tenant filling its share refuses no other tenant's retained PUBLISH."""

    def __init__(
        self,
        max_count: int = MAX_RETAINED,
        max_bytes: int = MAX_RETAINED_BYTES,
        vpns: Callable[[], int] = lambda: 1,
    ) -> None:
        self.max_count, self.max_bytes, self.vpns = max_count, max_bytes, vpns
        self.by_vpn: dict[str, dict[str, Retained]] = {}  # VPN -> internal subject (prefixed) -> message
        self.bytes_of: Counter[str] = Counter()  # VPN -> bytes held (payloads and subjects)
        self.refused: Counter[str] = Counter()  # VPN -> retained PUBLISHes refused past its share
        self.quiet = QuietLog(log)

    @property
    def count(self) -> int:
        return sum(len(messages) for messages in self.by_vpn.values())

    @property
    def total_bytes(self) -> int:
        return self.bytes_of.total()

    def usage(self, vpn: str) -> tuple[int, int]:
        """A VPN's retained messages and their bytes."""
        return len(self.by_vpn.get(vpn, ())), self.bytes_of[vpn]

    def put(self, subject: str, payload: bytes, qos: int) -> bool:
        """Retain (or, with an empty payload, forget) ``subject``'s message; False past its VPN's share."""
        vpn = vpn_of(subject)
        messages = self.by_vpn.setdefault(vpn, {})
        old = messages.pop(subject, None)
        if old is not None:
            self.bytes_of[vpn] -= len(old.payload) + len(subject)
        size = len(payload) + len(subject)
        shares = max(self.vpns(), 1)
        full = (
            len(messages) >= self.max_count // shares or self.bytes_of[vpn] + size > self.max_bytes // shares
        )
        if payload and full:
            self.refused[vpn] += 1
            self.quiet.warning(
                f"retained_{vpn}",
                "MQTT: a retained message of VPN %r not kept: its share of the node's retained messages "
                "(%d of %d, %d of %d bytes) is full",
                vpn,
                len(messages),
                self.max_count // shares,
                self.bytes_of[vpn],
                self.max_bytes // shares,
            )
        elif payload:
            messages[subject] = Retained(payload, qos)
            self.bytes_of[vpn] += size
        if not messages:
            del self.by_vpn[vpn]
        return not (payload and full)

    def candidates(self, pattern: str) -> list[tuple[str, Retained]]:
        """The retained messages ``pattern`` (internal, with its VPN's prefix) may match: its VPN's only."""
        return list(self.by_vpn.get(vpn_of(pattern), {}).items())


class RetainedSender:
    """The retained messages a connection's new subscriptions get, a slice per turn of the loop: one
    SUBSCRIBE of 1,000 filters over 10,000 retained topics held the node's loop for tens of seconds."""

    def __init__(self, conn: MqttConnection, limit: int) -> None:
        self.conn = conn
        self.limit = limit  # filters whose retained messages are still to be sent, at most
        self.due: deque[str] = deque()  # patterns of new subscriptions
        self.task: asyncio.Task[None] | None = None

    def add(self, patterns: Iterable[str]) -> bool:
        """Send the retained messages of ``patterns`` (each once); False: too many are due."""
        self.due.extend(dict.fromkeys(patterns))
        if len(self.due) > self.limit:
            return False
        if self.due and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._send())
        return True

    async def _send(self) -> None:
        conn = self.conn
        try:
            while self.due and not conn.closing:
                pattern = self.due.popleft()
                kept = conn.door.retained.candidates(pattern)
                for start in range(0, len(kept), RETAINED_SLICE):
                    for subject, message in kept[start : start + RETAINED_SLICE]:
                        if matches(pattern, subject):
                            qos = min(message.qos, qos_for(conn, subject))
                            topic = to_topic(outward(conn.prefix, subject))
                            conn.deliver_publish(topic, message.payload, qos, retain=True)
                    await asyncio.sleep(0)
                    if conn.closing:
                        return
        finally:
            self.task = None


class RetainHolder:
    """The door's holder of ``$mqtt.`` subjects: retained messages published on other nodes."""

    def __init__(self, door: MqttDoor) -> None:
        self.door = door

    def deliver(self, event: MeshEvent) -> None:
        """One byte of QoS, then the payload; an empty body clears the topic's."""
        if event.source != self.door.origin:
            qos = event.body[0] & 1 if event.body else 0
            self.door.retained.put(event.subject[len(RETAIN_PREFIX) :], event.body[1:], qos)
