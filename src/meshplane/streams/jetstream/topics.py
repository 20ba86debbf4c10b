"""Each server's view of a topic on JetStream: per partition, the bounds JetStream last reported
(from acknowledgements, other servers' notices and periodic stream info); the records stay in
JetStream."""

from __future__ import annotations

from meshplane.streams.jetstream.store import StreamBounds
from meshplane.streams.topics import TopicBase, TopicSettings


class JetStreamPartition:
    """A partition's bounds as last reported by JetStream (no I/O)."""

    def __init__(self) -> None:
        self.bounds = StreamBounds()
        self.problems: list[str] = []

    def saw(self, bounds: StreamBounds) -> None:
        if bounds.last_seq >= self.bounds.last_seq:
            self.bounds = bounds

    def saw_sequence(self, seq: int) -> None:
        """An append at ``seq`` (a notice or an acknowledgement): the end moves, never back."""
        b = self.bounds
        if seq > b.last_seq:
            first = b.first_seq if b.messages else seq - (seq - b.last_seq - 1)
            self.bounds = StreamBounds(first, seq, b.messages + seq - b.last_seq, b.bytes)

    @property
    def start_offset(self) -> int:
        return self.bounds.start_offset

    @property
    def next_offset(self) -> int:
        return self.bounds.next_offset

    @property
    def size_bytes(self) -> int:
        return self.bounds.bytes

    @property
    def segment_count(self) -> int:
        return 0


class JetStreamTopic(TopicBase[JetStreamPartition]):
    def __init__(self, name: str, settings: TopicSettings) -> None:
        super().__init__(name, settings)
        self.grow_to(settings.num_partitions)

    def grow_to(self, count: int) -> None:
        while len(self.partitions) < count:
            self._add_partition(JetStreamPartition())
