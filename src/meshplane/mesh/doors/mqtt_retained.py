"""The MQTT door's retained messages: the last retained PUBLISH of each topic, bounded.

Each node with an MQTT door keeps its own copy. A retained PUBLISH is stored on its node and sent to
the others as a direct event on ``$mqtt.<subject>`` (reserved: no client of the mesh sees it), which
every door subscribes to, so an MQTT client subscribing on any node gets it. The copy is in memory and
reaches the nodes that are up: a node started (or restarted) later knows only what was retained after.
Bounded (:data:`MAX_RETAINED`, :data:`MAX_RETAINED_BYTES`): a new topic past them is not retained,
counted; an empty retained payload deletes the topic's message, as MQTT says.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_RETAINED = 10_000  # topics with a retained message, per node
MAX_RETAINED_BYTES = 64 * 1024 * 1024
RETAIN_PREFIX = "$mqtt."  # the subject a retained message travels on to the other nodes


@dataclass(slots=True)
class Retained:
    payload: bytes
    qos: int


class RetainedStore:
    def __init__(self, max_count: int = MAX_RETAINED, max_bytes: int = MAX_RETAINED_BYTES) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self.messages: dict[str, Retained] = {}  # by internal subject (with its VPN's prefix)
        self.bytes = 0
        self.refused = 0

    def put(self, subject: str, payload: bytes, qos: int) -> bool:
        """Retain (or, with an empty payload, forget) ``subject``'s message; False when past the bounds."""
        old = self.messages.pop(subject, None)
        if old is not None:
            self.bytes -= len(old.payload) + len(subject)
        if not payload:
            return True
        size = len(payload) + len(subject)
        if len(self.messages) >= self.max_count or self.bytes + size > self.max_bytes:
            self.refused += 1
            return False
        self.messages[subject] = Retained(payload, qos)
        self.bytes += size
        return True
