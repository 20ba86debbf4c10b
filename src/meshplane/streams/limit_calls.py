"""The streams service's calls that change a topic's retention or a room's limits, mixed into it
(as :class:`~meshplane.streams.staging.StagedWrites`); a shared backend overrides what it keeps elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from meshplane.core.streamlog import RetentionPolicy
from meshplane.streams.config import now_ms
from meshplane.streams.errors import BadRequest
from meshplane.streams.rooms import LocalRoom, Room, room_settings
from meshplane.streams.topics import TopicBase

if TYPE_CHECKING:
    from meshplane.streams.service import StreamsService


class LimitCalls:
    def _limits_of(self) -> StreamsService:
        return cast("StreamsService", self)

    async def set_topic_retention(self, name: str, retention: RetentionPolicy) -> TopicBase[Any]:
        """Saved before it answers; applied by the next retention pass (a shorter one deletes the
        whole segments it no longer keeps, a longer one brings nothing back)."""
        return self._limits_of().topic_store.set_retention(name, retention)

    async def set_room_retention(self, name: str, max_events: int, retention_secs: float | None) -> Room:
        """Change a room's limits (``retention_secs`` None: no age limit): saved, then applied at once."""
        service = self._limits_of()
        room = service.room(name)
        if not isinstance(room, LocalRoom):
            raise BadRequest("changing a room's retention is not supported by this storage backend")
        room.set_limits(room_settings(service.config, max_events, None)[0], retention_secs, now_ms())
        return room
