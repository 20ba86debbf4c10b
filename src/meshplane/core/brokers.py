"""Broker mode, the pure parts: ``DYN_ZMQ_BROKER_URL`` parsing, rendezvous (HRW) selection, dedup."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

from meshplane.errors import ConfigError, InvalidDiscoveryRecord

BROKERS_BUCKET = "v1/event_brokers"
_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """One broker: publishers connect to ``xsub``, subscribers to ``xpub``."""

    xsub: str
    xpub: str

    @property
    def key(self) -> str:
        """A stable name for hashing and discovery: the XSUB endpoint identifies a broker."""
        return self.xsub


def parse_broker_url(text: str) -> tuple[BrokerAddress, ...]:
    """Parse ``"xsub=tcp://h:5555;tcp://h2:5555 , xpub=tcp://h:5556;tcp://h2:5556"`` (spaces tolerated)."""
    sides: dict[str, list[str]] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip().lower()
        if not sep or name not in ("xsub", "xpub"):
            raise ConfigError(f"DYN_ZMQ_BROKER_URL: {part.strip()!r} is not xsub=... or xpub=...")
        if name in sides:
            raise ConfigError(f"DYN_ZMQ_BROKER_URL: {name} is given twice")
        endpoints = [e.strip() for e in value.split(";") if e.strip()]
        if not endpoints:
            raise ConfigError(f"DYN_ZMQ_BROKER_URL: {name}= names no endpoint")
        for endpoint in endpoints:
            if not endpoint.startswith(_SCHEMES) or endpoint.endswith("://"):
                raise ConfigError(f"DYN_ZMQ_BROKER_URL: {name} endpoint {endpoint!r} is not tcp://host:port")
        sides[name] = endpoints
    for name in ("xsub", "xpub"):
        if name not in sides:
            raise ConfigError(f"DYN_ZMQ_BROKER_URL: {name}= is missing (expected 'xsub=... , xpub=...')")
    xsubs, xpubs = sides["xsub"], sides["xpub"]
    if len(xsubs) != len(xpubs):
        raise ConfigError(
            f"DYN_ZMQ_BROKER_URL: {len(xsubs)} xsub endpoints but {len(xpubs)} xpub endpoints; "
            "list one of each per broker, in the same order"
        )
    return tuple(BrokerAddress(s, p) for s, p in zip(xsubs, xpubs, strict=True))


def rendezvous_score(identity: int, broker: BrokerAddress) -> int:
    """``identity``: the publisher's stable identity (``publisher_identity``), not its per-life id."""
    digest = hashlib.blake2b(f"{identity:x}|{broker.key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def select_brokers(identity: int, brokers: list[BrokerAddress], k: int) -> list[BrokerAddress]:
    """The ``k`` brokers with the highest rendezvous score for this publisher (all when ``k <= 0``).

    Every process computes the same choice, and removing a broker only moves the publishers that had
    chosen it.
    """
    if k <= 0 or k >= len(brokers):
        return sorted(brokers, key=lambda b: b.key)
    return sorted(brokers, key=lambda b: rendezvous_score(identity, b), reverse=True)[:k]


def broker_record(instance_id: int, address: BrokerAddress, stats: str | None = None) -> bytes:
    """The record a broker registers; ``stats`` is where it answers for its counters (dashboards)."""
    record: dict[str, object] = {
        "type": "ZmqBroker",
        "instance_id": instance_id,
        "xsub": address.xsub,
        "xpub": address.xpub,
    }
    if stats is not None:
        record["stats"] = stats
    return json.dumps(record, separators=(",", ":")).encode()


def parse_broker_record(data: bytes) -> BrokerAddress:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidDiscoveryRecord(f"broker record is not JSON: {exc}") from exc
    if not isinstance(value, dict) or value.get("type") != "ZmqBroker":
        raise InvalidDiscoveryRecord("not a ZmqBroker record")
    xsub, xpub = value.get("xsub"), value.get("xpub")
    if not (
        isinstance(xsub, str)
        and xsub.startswith(_SCHEMES)
        and isinstance(xpub, str)
        and xpub.startswith(_SCHEMES)
    ):
        raise InvalidDiscoveryRecord("broker record needs xsub and xpub endpoints")
    return BrokerAddress(xsub, xpub)


class DedupCache:
    """Remembers the last ``capacity`` ``(publisher_id, sequence)`` pairs; memory is bounded by it.

    Copies of one event arrive through different brokers within a short time of each other, so a
    window of recent pairs is enough to drop every duplicate.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError(f"dedup cache capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.duplicates = 0

    def first_time(self, publisher_id: int, sequence: int) -> bool:
        """True the first time a pair is seen (and remembers it), False for a duplicate."""
        key = (publisher_id, sequence)
        seen = self._seen
        if key in seen:
            self.duplicates += 1
            return False
        seen[key] = None
        if len(seen) > self.capacity:
            seen.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._seen)
