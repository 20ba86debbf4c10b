"""A client's QoS 1 PUBLISHes being stored, and a persistent session's stored lately.

A QoS 1 PUBLISH whose PUBACK was lost with its connection comes again with DUP, under the same packet
id, when its client reconnects to its session. MQTT allows storing it twice (at least once); the door
does not, where it can tell: a persistent session remembers the packet id and a digest (topic and
payload) of its last :data:`PER_SESSION` PUBLISHes stored, and a PUBLISH with DUP matching one is
acknowledged without being stored again. Bounded (:data:`REMEMBERED` in all, the sessions used least
lately forgotten first) and in memory: a resend after the node restarted is stored again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

PER_SESSION = 128  # packet ids remembered per persistent session (a client's PUBLISHes in flight)
REMEMBERED = 100_000  # ... in all


@dataclass(slots=True)
class Pending:
    """A QoS 1 PUBLISH of the client being stored: its answer ("" stored), None until it comes."""

    packet_id: int
    digest: bytes = b""  # a persistent session's PUBLISH: remembered once stored
    error: str | None = None


def digest(topic: str, payload: bytes) -> bytes:
    hashed = hashlib.blake2b(topic.encode(), digest_size=16)
    hashed.update(b"\x00")
    hashed.update(payload)
    return hashed.digest()


class Stored:
    """Per persistent session (by VPN and client id), packet id -> digest of its PUBLISHes stored lately."""

    def __init__(self, per_session: int = PER_SESSION, total: int = REMEMBERED) -> None:
        self.per_session, self.total = per_session, total
        self.by_session: OrderedDict[tuple[str, str], OrderedDict[int, bytes]] = OrderedDict()
        self.count = 0

    def remember(self, key: tuple[str, str], packet_id: int, digest: bytes) -> None:
        ids = self.by_session.setdefault(key, OrderedDict())
        self.by_session.move_to_end(key)
        if ids.pop(packet_id, None) is None:
            self.count += 1
        ids[packet_id] = digest
        if len(ids) > self.per_session:
            ids.popitem(last=False)
            self.count -= 1
        while self.count > self.total:
            _, oldest = self.by_session.popitem(last=False)
            self.count -= len(oldest)

    def stored(self, key: tuple[str, str], packet_id: int, digest: bytes) -> bool:
        ids = self.by_session.get(key)
        return ids is not None and ids.get(packet_id) == digest

    def forget(self, key: tuple[str, str]) -> None:
        self.count -= len(self.by_session.pop(key, ()))
