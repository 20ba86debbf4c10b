"""EventChannel records on top of raw discovery events: parse, validate, count what is unusable."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from meshplane.core.records import EventChannel
from meshplane.core.snapshots import Added
from meshplane.discovery.base import Discovery
from meshplane.errors import InvalidDiscoveryRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChannelAdded:
    channel: EventChannel


@dataclass(frozen=True, slots=True)
class ChannelRemoved:
    channel: EventChannel


ChannelEvent = ChannelAdded | ChannelRemoved


class ChannelWatch:
    """Follows the publishers registered under a prefix; ``invalid`` counts records it had to skip."""

    def __init__(self, discovery: Discovery, prefix: str) -> None:
        self._discovery = discovery
        self._prefix = prefix
        self.channels: dict[str, EventChannel] = {}
        self.invalid = 0

    def seed(self, records: dict[str, bytes]) -> list[EventChannel]:
        """Take an initial listing (valid records only), so the watch does not report them again."""
        for key, value in records.items():
            with contextlib.suppress(InvalidDiscoveryRecord):  # counted when the watch reports it
                self.channels[key] = parse_channel(key, value)
        return list(self.channels.values())

    async def events(self) -> AsyncIterator[ChannelEvent]:
        async for event in self._discovery.list_and_watch(self._prefix):
            channel: EventChannel | None = None
            if isinstance(event, Added):
                try:
                    channel = parse_channel(event.key, event.value)
                except InvalidDiscoveryRecord as exc:
                    self.invalid += 1
                    log.warning("skipping discovery record %s: %s", event.key, exc)
            previous = self.channels.get(event.key)
            if previous == channel:
                continue
            if previous is not None:
                del self.channels[event.key]
                yield ChannelRemoved(previous)
            if channel is not None:
                self.channels[event.key] = channel
                yield ChannelAdded(channel)


def parse_channel(key: str, value: bytes) -> EventChannel:
    """Parse a record and check that it is filed under the key its own content implies."""
    channel = EventChannel.from_json(value)
    if channel.key != key:
        raise InvalidDiscoveryRecord(f"record describes {channel.key}, but is stored under {key}")
    return channel
