"""``meshplane vpn show`` on a real node (issue 58): every limit the VPN file sets for a VPN, its
streams service's counts (max_topics, max_partitions, max_rooms, max_groups) beside the mesh's, and
each user's limits (max_spool_bytes among them), after a reload too; never a password hash."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from meshplane.cli.main import main
from meshplane.launchers import StreamsServerProcess
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.support.mesh import status

SECRET = "alice-password-0001"


def _file(max_groups: int) -> str:
    return (
        "[vpns.A]\nmax_queues = 3\nmax_topics = 7\nmax_partitions = 11\nmax_rooms = 5\n"
        f"max_groups = {max_groups}\n"
        f'[vpns.A.users.alice]\npassword_hash = "{hash_password(SECRET)}"\n'
        "max_spool_bytes = 65536\nmax_connections = 2\n[vpns.B]\n"
    )


async def _show(node: StreamsServerProcess, vpn: str, capsys: pytest.CaptureFixture[str]) -> Any:
    assert await asyncio.to_thread(main, ["vpn", "show", vpn, "--url", node.url, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


async def test_vpn_show_lists_the_streams_limits_and_each_users_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vpns = tmp_path / "vpns.toml"
    vpns.write_text(_file(max_groups=4))
    with StreamsServerProcess(
        extra_args=("--node-id", "a", "--route-port", "0", "--mesh-vpns", str(vpns))
    ) as proc:
        node = proc.start()
        shown = await _show(node, "A", capsys)
        want = {"max_queues": 3, "max_topics": 7, "max_partitions": 11, "max_rooms": 5, "max_groups": 4}
        assert {key: shown["limits"][key] for key in want} == want, shown
        alice = shown["user_limits"]["alice"]
        assert (alice["max_spool_bytes"], alice["max_connections"], alice["max_subscriptions"]) == (
            65536,
            2,
            None,
        )
        assert "argon2" not in json.dumps(shown)
        other = await _show(node, "B", capsys)  # a VPN that sets none: none shown, no users
        assert (other["limits"]["max_topics"], other["user_limits"]) == (None, {}), other

        vpns.write_text(_file(max_groups=9))
        node.kill(signal.SIGHUP)

        async def reloaded() -> bool:
            return bool((await status(node))["vpns_reload"].get("reloaded", 0) >= 1)

        await eventually(reloaded, what="the VPN file read again")
        assert (await _show(node, "A", capsys))["limits"]["max_groups"] == 9
