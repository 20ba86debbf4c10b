"""Other doors to a VPN (NATS, MQTT listeners) check passwords through the node's own queue of
password checks (``Logins.authenticate``): the same answers as a LOGIN, the same fairness by address,
the same bound."""

from __future__ import annotations

import asyncio

from meshplane.core.mesh.login_checks import ADDRESS_BUSY, WRONG
from meshplane.mesh.config import MeshConfig
from meshplane.mesh.node import MeshNode
from meshplane.mesh.vpns import hash_password, parse_vpns


async def test_a_door_checks_passwords_in_the_nodes_fair_bounded_queue() -> None:
    vpns = parse_vpns(f'[vpns.A.users.alice]\npassword_hash = "{hash_password("right")}"\n')
    logins = MeshNode(MeshConfig(node_id="a", vpns=vpns)).logins
    user, why = await logins.authenticate("A", "alice", "right", "10.0.0.1")
    assert user is not None
    assert (user.name, why) == ("alice", "")
    assert await logins.authenticate("A", "alice", "wrong", "10.0.0.1") == (None, WRONG)
    assert await logins.authenticate("A", "mallory", "right", "10.0.0.1") == (None, WRONG)

    done: list[str] = []

    async def attempt(tag: str, password: str, address: str) -> tuple[str, str]:
        _, why = await logins.authenticate("A", "alice", password, address)
        done.append(tag)
        return tag, why

    flood = [attempt(f"guess-{i}", "guess", "10.0.0.9") for i in range(12)]
    answers = dict(await asyncio.gather(*flood, attempt("alice", "right", "10.0.0.2")))
    assert answers["alice"] == ""
    assert sorted(why for tag, why in answers.items() if tag != "alice") == [ADDRESS_BUSY] * 3 + [WRONG] * 9
    # one running and 8 waiting from the flood's address; alice, from another, is checked next
    assert done.index("alice") <= 3 + 1, done  # after the refusals and the flood's check under way
    assert logins.busy["A"] == 3
    assert logins.refused["A"] == 2 + 12
    assert (logins.checks.running, logins.checks.waiting) == (0, 0)
