"""The consumer-group routes: thin adapters from HTTP to the group commands the WebSocket channel runs too."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from meshplane.streams.errors import NotFound
from meshplane.streams.http.commands import Commands, check_reset
from meshplane.streams.http.params import (
    GRANT,
    get_int,
    get_str,
    json_response,
    positive,
    read_json,
    readable,
)
from meshplane.streams.http.vpn_queues import STORED_TOPIC, counted_groups, queue_groups
from meshplane.streams.service import StreamsService

PATH_FIELDS = {"group": "group", "member": "member_id", "partition": "partition_id"}


class GroupApi:
    def __init__(self, engine: StreamsService, commands: Commands) -> None:
        self.engine = engine
        self.commands = commands

    async def list(self, request: web.Request) -> web.Response:
        groups = readable(request, sorted({*self.engine.groups, *queue_groups(request)}))
        return json_response({"groups": groups, "count": len(groups)})

    async def create(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        group = await self.engine.create_group(
            request.match_info["group"],
            request.get(STORED_TOPIC) or get_str(body, "topic"),  # a VPN's queue's: as stored
            get_int(body, "partition_count", None, minimum=1),
            get_str(body, "strategy", "round_robin"),
            positive(body, "session_timeout_secs"),
            counted_groups(request, self.engine),
        )
        return json_response(
            {
                "success": True,
                "group_id": group.group_id,
                "topic": group.topic,
                "strategy": group.strategy,
                "partition_count": group.partitions,
            },
            201,
        )

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["group"]
        if not await self.engine.delete_group(name):
            raise NotFound(f"consumer group {name!r} not found")
        return json_response({"success": True, "group_id": name})

    async def _command(
        self, request: web.Request, run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    ) -> web.Response:
        """A group route: the body (if any) and the path's names, handed to the group command."""
        body = await read_json(request) if request.can_read_body else {}
        for name, value in request.match_info.items():
            body[PATH_FIELDS[name]] = value
        return json_response(await run(body))

    async def join(self, request: web.Request) -> web.Response:
        return await self._command(request, self.commands.cmd_group_join)

    async def assignment(self, request: web.Request) -> web.Response:
        return await self._command(request, self.commands.cmd_group_assignment)

    async def heartbeat(self, request: web.Request) -> web.Response:
        return await self._command(request, self.commands.cmd_group_heartbeat)

    async def leave(self, request: web.Request) -> web.Response:
        return await self._command(request, self.commands.cmd_group_leave)

    async def commit(self, request: web.Request) -> web.Response:
        async def reset_checked(body: dict[str, Any]) -> dict[str, Any]:
            check_reset(body, request.get(GRANT))
            return await self.commands.cmd_group_commit(body)

        return await self._command(request, reset_checked)

    async def offset(self, request: web.Request) -> web.Response:
        return await self._command(request, self.commands.cmd_group_offset)

    async def stats(self, request: web.Request) -> web.Response:
        return json_response(await self.engine.group_stats(request.match_info["group"]))
