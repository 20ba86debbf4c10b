"""A burst of clients logging in at once (a fleet started together, or reconnecting after a node
restart) gets in: a LOGIN past the node's bounded queue of checks is refused "busy: try again later",
and the client does so, with backoff, within its connect timeout (issue 60: at first it gave up at
once, and only a reconnecting client retried)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from meshplane.core.mesh.login_checks import CheckLimits
from meshplane.errors import TransportAuthError
from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from meshplane.mesh.vpns import hash_password
from tests.support.mesh import status

PASSWORD = "fleet-pw-52c1"
# From one address: one check at a time, CheckLimits().queued_per_address waiting, the rest refused.
BURST = 3 * CheckLimits().queued_per_address


async def test_a_burst_of_logins_past_the_checks_queue_all_get_in(tmp_path: Path) -> None:
    vpns = tmp_path / "vpns.toml"
    vpns.write_text(f'[vpns.A.users.fleet]\npassword_hash = "{hash_password(PASSWORD)}"\n')
    with MeshCluster(1, extra_args=("--mesh-vpns", str(vpns))) as cluster:
        node = cluster.start()["a"]
        fleet = [
            MeshClient(node.route_url, vpn="A", user="fleet", password=PASSWORD, timeout=60)
            for _ in range(BURST)
        ]
        try:
            await asyncio.gather(*(client.connect() for client in fleet))
            assert all(client.connected for client in fleet)
            vpn = (await status(node))["vpns"]["A"]
            assert vpn["logins_busy"] > 0  # the burst did pass the queue: some were told to retry
        finally:
            await asyncio.gather(*(client.close() for client in fleet))


async def test_a_wrong_password_is_not_retried(tmp_path: Path) -> None:
    vpns = tmp_path / "vpns.toml"
    vpns.write_text(f'[vpns.A.users.fleet]\npassword_hash = "{hash_password(PASSWORD)}"\n')
    with MeshCluster(1, extra_args=("--mesh-vpns", str(vpns))) as cluster:
        node = cluster.start()["a"]
        client = MeshClient(node.route_url, vpn="A", user="fleet", password="wrong", timeout=60)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TransportAuthError, match="refused user"):
            await client.connect()
        assert loop.time() - started < 30  # refused, not retried until the 60 s timeout
        assert (await status(node))["vpns"]["A"]["logins_refused"] == 1
