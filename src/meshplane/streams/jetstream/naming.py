"""How meshplane's names map onto JetStream's (pure).

One stream per partition: a stream's sequence numbers are contiguous, so ``offset = sequence - 1``
holds for every partition, and each partition gets its own Raft group (leaders spread over the
cluster). A single stream with a subject per partition would interleave the partitions' sequences:
offsets with holes, and lag that cannot be computed by subtraction.
"""

from __future__ import annotations

from typing import Any

from meshplane.core.streamlog import RetentionPolicy

TOPICS_BUCKET = "MESHPLANE_TOPICS"
GROUPS_BUCKET = "MESHPLANE_GROUPS"
ROOMS_BUCKET = "MESHPLANE_ROOMS"
STREAM_PREFIX = "MESHPLANE_T_"
SUBJECT_PREFIX = "meshplane.streams.t"
NOTICE_PREFIX = "meshplane.streams.n"
NOTICES = NOTICE_PREFIX + ".>"
ROOM_STREAM_PREFIX = "MESHPLANE_R_"
ROOM_SUBJECT_PREFIX = "meshplane.streams.r"
ROOM_FEED_PREFIX = "meshplane.streams.rf"
ROOM_FEED = ROOM_FEED_PREFIX + ".>"
TIMESTAMP_HEADER = "Meshplane-Ts"
MAX_STREAM_NAME = 255


def escape(name: str) -> str:
    """Topic and group names may hold ``.`` and ``:``, which JetStream's subjects, stream names or
    keys do not take; ``=`` never occurs in a name, so this is reversible."""
    return name.replace("=", "=3D").replace(".", "=2E").replace(":", "=3A")


def unescape(token: str) -> str:
    return token.replace("=3A", ":").replace("=2E", ".").replace("=3D", "=")


def partition_stream(topic: str, partition: int) -> str:
    return f"{STREAM_PREFIX}{escape(topic)}_{partition}"


def partition_subject(topic: str, partition: int) -> str:
    return f"{SUBJECT_PREFIX}.{escape(topic)}.{partition}"


def notice_subject(topic: str, partition: int) -> str:
    """Where the server that appended says the partition's new last sequence (the payload, in
    digits): every server learns of every append and wakes its waiting readers."""
    return f"{NOTICE_PREFIX}.{escape(topic)}.{partition}"


def parse_notice(subject: str) -> tuple[str, int] | None:
    """(topic, partition) of a notice subject; ``None`` for anything else."""
    prefix = NOTICE_PREFIX + "."
    if not subject.startswith(prefix):
        return None
    token, _, partition = subject[len(prefix) :].rpartition(".")
    if not token or not partition.isdigit():
        return None
    return unescape(token), int(partition)


def room_stream(room: str) -> str:
    return ROOM_STREAM_PREFIX + escape(room)


def room_subject(room: str) -> str:
    return f"{ROOM_SUBJECT_PREFIX}.{escape(room)}"


def room_feed_subject(room: str) -> str:
    """Where a room's stream republishes each event it stored, whole, for every server's view."""
    return f"{ROOM_FEED_PREFIX}.{escape(room)}"


def parse_room_feed(subject: str) -> str | None:
    """The room of a feed subject; ``None`` for anything else."""
    prefix = ROOM_FEED_PREFIX + "."
    token = subject[len(prefix) :] if subject.startswith(prefix) else ""
    return unescape(token) if token and "." not in token else None


def retention_limits(policy: RetentionPolicy) -> dict[str, Any]:
    """A retention policy as JetStream stream limits (-1: none). JetStream removes single messages
    where the local log removes whole segments: it keeps no more than the policy, never less."""
    return {
        "max_age": policy.retention_secs or 0.0,
        "max_bytes": policy.max_bytes if policy.max_bytes is not None else -1,
        "max_msgs": policy.max_messages if policy.max_messages is not None else -1,
    }


def message_id(idempotency_key: str, index: int) -> str:
    """The ``Nats-Msg-Id`` of the ``index``-th event of a request: a retried request repeats them, and
    the stream's duplicate window turns the retry into the first answer."""
    return f"{idempotency_key}#{index}"
