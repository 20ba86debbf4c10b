"""How meshplane's names map onto JetStream's (pure).

One stream per partition: a stream's sequence numbers are contiguous, so ``offset = sequence - 1``
holds for every partition, and each partition gets its own Raft group (leaders spread over the
cluster). A single stream with a subject per partition would interleave the partitions' sequences:
offsets with holes, and lag that cannot be computed by subtraction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from meshplane.core.mesh.vpn import DEFAULT, check_vpn
from meshplane.core.streamlog import RetentionPolicy

# The default VPN's buckets; its streams are MESHPLANE_T_... (topics' partitions) and MESHPLANE_R_...
# (rooms), its subjects meshplane.streams.t|n|r|rf|ps... (Naming: every VPN's).
TOPICS_BUCKET = "MESHPLANE_TOPICS"
GROUPS_BUCKET = "MESHPLANE_GROUPS"
ROOMS_BUCKET = "MESHPLANE_ROOMS"
TIMESTAMP_HEADER = "Meshplane-Ts"
MAX_STREAM_NAME = 255


def escape(name: str) -> str:
    """Topic and group names may hold ``.`` and ``:``, which JetStream's subjects, stream names or
    keys do not take; ``=`` never occurs in a name, so this is reversible."""
    return name.replace("=", "=3D").replace(".", "=2E").replace(":", "=3A")


def unescape(token: str) -> str:
    return token.replace("=3A", ":").replace("=2E", ".").replace("=3D", "=")


@dataclass(frozen=True)
class Naming:
    """The JetStream names of one Message VPN's streams. The default VPN's are those above, as they
    always were; VPN ``A``'s carry it: streams ``MESHPLANE_VA=T_...`` (``=`` never occurs in a VPN
    name, so it ends the VPN's), buckets ``MESHPLANE_TOPICS_VA``, subjects ``meshplane.streams.v.A.t...``
    (a VPN name is one subject token). No two VPNs' names, subjects or subject filters overlap."""

    vpn: str = DEFAULT

    def __post_init__(self) -> None:
        named = self.vpn != DEFAULT
        streams = f"MESHPLANE_V{check_vpn(self.vpn)}=" if named else "MESHPLANE_"
        subjects = f"meshplane.streams.v.{self.vpn}" if named else "meshplane.streams"
        buckets = f"_V{self.vpn}" if named else ""
        put = partial(object.__setattr__, self)
        put("topics_bucket", TOPICS_BUCKET + buckets)
        put("groups_bucket", GROUPS_BUCKET + buckets)
        put("rooms_bucket", ROOMS_BUCKET + buckets)
        put("stream_prefix", streams + "T_")
        put("room_stream_prefix", streams + "R_")
        put("subject_prefix", subjects + ".t")
        put("notice_prefix", subjects + ".n")
        put("room_subject_prefix", subjects + ".r")
        put("room_feed_prefix", subjects + ".rf")
        put("pubsub_prefix", subjects + ".ps.")
        put("notices", subjects + ".n.>")
        put("room_feed", subjects + ".rf.>")

    topics_bucket: str = field(init=False)
    groups_bucket: str = field(init=False)
    rooms_bucket: str = field(init=False)
    stream_prefix: str = field(init=False)
    room_stream_prefix: str = field(init=False)
    subject_prefix: str = field(init=False)
    notice_prefix: str = field(init=False)
    room_subject_prefix: str = field(init=False)
    room_feed_prefix: str = field(init=False)
    pubsub_prefix: str = field(init=False)
    notices: str = field(init=False)
    room_feed: str = field(init=False)

    def partition_stream(self, topic: str, partition: int) -> str:
        return f"{self.stream_prefix}{escape(topic)}_{partition}"

    def partition_subject(self, topic: str, partition: int) -> str:
        return f"{self.subject_prefix}.{escape(topic)}.{partition}"

    def notice_subject(self, topic: str, partition: int) -> str:
        """Where the server that appended says the partition's new last sequence (the payload, in
        digits): every server learns of every append and wakes its waiting readers."""
        return f"{self.notice_prefix}.{escape(topic)}.{partition}"

    def parse_notice(self, subject: str) -> tuple[str, int] | None:
        """(topic, partition) of a notice subject; ``None`` for anything else."""
        prefix = self.notice_prefix + "."
        if not subject.startswith(prefix):
            return None
        token, _, partition = subject[len(prefix) :].rpartition(".")
        if not token or not partition.isdigit():
            return None
        return unescape(token), int(partition)

    def room_stream(self, room: str) -> str:
        return self.room_stream_prefix + escape(room)

    def room_subject(self, room: str) -> str:
        return f"{self.room_subject_prefix}.{escape(room)}"

    def room_feed_subject(self, room: str) -> str:
        """Where a room's stream republishes each event it stored, whole, for every server's view."""
        return f"{self.room_feed_prefix}.{escape(room)}"

    def parse_room_feed(self, subject: str) -> str | None:
        """The room of a feed subject; ``None`` for anything else."""
        prefix = self.room_feed_prefix + "."
        token = subject[len(prefix) :] if subject.startswith(prefix) else ""
        return unescape(token) if token and "." not in token else None


DEFAULT_NAMING = Naming()
# The default VPN's names, as functions (what tests and tools outside a service name them by).
partition_stream = DEFAULT_NAMING.partition_stream
partition_subject = DEFAULT_NAMING.partition_subject
notice_subject = DEFAULT_NAMING.notice_subject
parse_notice = DEFAULT_NAMING.parse_notice
room_stream = DEFAULT_NAMING.room_stream
room_subject = DEFAULT_NAMING.room_subject
room_feed_subject = DEFAULT_NAMING.room_feed_subject
parse_room_feed = DEFAULT_NAMING.parse_room_feed


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
