"""The streams service's settings, and the names and ids it hands out."""

from __future__ import annotations

import itertools
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from meshplane.config import default_state_dir
from meshplane.core.backpressure import BackpressurePolicy
from meshplane.streams.errors import BadRequest

FsyncPolicy = Literal["always", "interval", "never"]
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}")


def check_name(kind: str, name: object) -> str:
    """Room, topic and group names become directory names: keep them to a safe alphabet."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise BadRequest(
            f"invalid {kind} name {name!r}: use 1-200 of A-Z a-z 0-9 _ . : - (not starting with . : -)"
        )
    return name


_ID_PREFIX = uuid.uuid4().hex[:12]
_id_counter = itertools.count()


def new_event_id() -> str:
    """Unique event ids without a uuid4 per event (which costs a system call): a random per-process
    prefix and a counter."""
    return f"{_ID_PREFIX}{next(_id_counter):012x}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class StreamsConfig:
    data_dir: Path = field(default_factory=lambda: default_state_dir() / "streams")
    fsync: FsyncPolicy = "interval"
    fsync_interval_ms: float = 10.0
    fsync_every_records: int = 0  # with "interval": also fsync once this many records wait (0: off)
    segment_bytes: int = 64 * 1024 * 1024
    max_payload_bytes: int = 1024 * 1024
    auto_create_rooms: bool = True
    room_max_events: int = 10_000
    room_retention_secs: float | None = 24 * 3600.0
    max_rooms: int = 10_000
    room_max_events_limit: int = 1_000_000  # the largest max_events a room may ask for
    room_max_bytes: int = 16 * 1024 * 1024  # each room's in-memory history
    room_memory_bytes: int = 512 * 1024 * 1024  # all rooms' histories together
    max_topics: int = 10_000
    max_partitions: int = 100_000  # all topics' partitions together
    max_groups: int = 10_000  # consumer groups
    max_open_files: int | None = None  # segment files open at once (None: half of RLIMIT_NOFILE)
    idempotency_keys: int = 100_000  # idempotent publishes remembered ...
    idempotency_bytes: int = 64 * 1024 * 1024  # ... in at most this much memory ...
    idempotency_ttl_secs: float = 7 * 24 * 3600.0  # ... for at most this long
    staging_max_stages: int = 10_000  # staged writes (a Spark task attempt's rows before its commit) ...
    staging_max_bytes: int = 1 << 30  # ... at most this many bytes on disk ...
    staging_ttl_secs: float = 3600.0  # ... dropped once untouched this long (the attempt died)
    max_subscribers_per_room: int = 10_000
    room_inactive_timeout: float = 24 * 3600.0
    cleanup_interval: float = 1.0
    # Sealed segments are trusted up to their index when the server starts; their crcs are then
    # checked in the background, this many bytes per cleanup cycle (0: never).
    verify_bytes_per_cycle: int = 4 * 1024 * 1024
    default_partitions: int = 3
    default_session_timeout: float = 30.0
    pubsub_queue_size: int = 10_000
    pubsub_backpressure: BackpressurePolicy = "drop_newest"  # what a pub/sub listener's full queue does
    # The HTTP side: a connection that sends no whole request (headers) within idle_timeout_secs, or
    # not its whole body within body_timeout_secs, is closed; pushed SSE subscribers get a comment
    # every push_keepalive_secs, so one that vanished is noticed on an idle room.
    idle_timeout_secs: float = 15.0
    body_timeout_secs: float = 30.0
    push_keepalive_secs: float = 15.0
