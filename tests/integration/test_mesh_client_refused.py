"""A MeshClient whose credentials the node no longer takes (its user's password changed by a reload:
the node refuses and closes it) stops reconnecting with them: each attempt cost the node an argon2
check, every two seconds, for as long as the process lived, and the application was never told."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from meshplane.errors import TransportAuthError
from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.support.mesh import status

OLD, NEW = "erin-pw-old-51d2", "erin-pw-new-a07b"


async def _refused(node: object) -> int:
    return int((await status(node))["vpns"]["A"]["logins_refused"])  # type: ignore[arg-type]


async def test_a_client_whose_password_a_reload_changed_stops_retrying_it(tmp_path: Path) -> None:
    vpns = tmp_path / "vpns.toml"
    vpns.write_text(f'[vpns.A.users.erin]\npassword_hash = "{hash_password(OLD)}"\n')
    with MeshCluster(1, extra_args=("--mesh-vpns", str(vpns))) as cluster:
        node = cluster.start()["a"]
        client = await MeshClient(node.route_url, vpn="A", user="erin", password=OLD, timeout=5).connect()
        try:
            vpns.write_text(f'[vpns.A.users.erin]\npassword_hash = "{hash_password(NEW)}"\n')
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{node.url}/mesh/vpns/reload") as response,
            ):
                assert response.status == 200, await response.text()
            await eventually(lambda: not client.connected, timeout=30, what="the client cut")

            async def tried_again() -> bool:
                return await _refused(node) >= 1

            await eventually(tried_again, timeout=30, what="its reconnection refused")
            await asyncio.sleep(0)
            # Retrying could not succeed: a wrong password is not tried again and again.
            first = await _refused(node)
            deadline = asyncio.get_running_loop().time() + 8  # four of its reconnection delays
            while asyncio.get_running_loop().time() < deadline:
                assert await _refused(node) == first, "the client kept logging in with its old password"
                await asyncio.sleep(0.5)
            with pytest.raises(TransportAuthError, match="erin"):
                await client.flush()
        finally:
            await client.close()
