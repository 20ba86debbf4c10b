"""Queue permissions (issue 58) on a real node: who may create, bind and read a VPN's queues. The MQTT
door's persistent sessions keep their QoS 1 messages in a queue of their own (``mqtt-<hash>``), so a
user's queue permissions decide whether it gets one; a refusal is said (SUBACK 0x87) and counted,
and a reload that narrows them applies to the next connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from meshplane.launchers import MeshCluster
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.support.mesh import status
from tests.support.mqtt import Paho, connected, subscribed

PASSWORD = "pw-5e1d"


def vpn_file(hashed: str, carol_reads: bool = True) -> str:
    read = "" if carol_reads else ', read = { deny = ["mqtt-*"] }'
    return (
        f'[vpns.team-a.users.carol]\npassword_hash = "{hashed}"\n'
        f'queues = {{ create = {{ allow = ["mqtt-*"] }}{read} }}\n'
        f'[vpns.team-a.users.dave]\npassword_hash = "{hashed}"\n'
        'queues = { create = { allow = ["orders-*"] } }\n'
        f'[vpns.team-a.users.pub]\npassword_hash = "{hashed}"\n'
    )


def as_user(client: Paho, user: str) -> Paho:
    client.client.username_pw_set(f"{user}@team-a", PASSWORD)
    return client


async def publish_qos1(client: Paho, topic: str, body: bytes) -> None:
    info = client.client.publish(topic, body, qos=1)
    await asyncio.to_thread(info.wait_for_publish, 20)
    assert info.is_published()


async def test_queue_permissions_decide_who_keeps_a_persistent_session_queue(tmp_path: Path) -> None:
    vpns = tmp_path / "vpns.toml"
    hashed = await asyncio.to_thread(hash_password, PASSWORD)
    vpns.write_text(vpn_file(hashed))
    args = ("--mesh-vpns", str(vpns), "--mqtt-port", "0")
    with MeshCluster(1, node_args={"a": args}) as cluster:
        node = cluster.start()["a"]
        port = node.door_port("mqtt")
        carol = await connected(as_user(Paho(port, "carol-1", v5=True, clean=False), "carol"))
        dave = await connected(as_user(Paho(port, "dave-1", v5=True, clean=False), "dave"))
        pub = await connected(as_user(Paho(port, "pub-1"), "pub"))
        try:
            await subscribed(carol, "orders/#", 1)  # her session's queue: mqtt-* she may create
            await subscribed(dave, "orders/#", 1)  # his would be mqtt-*: only orders-* for him
            await subscribed(dave, "orders/#", 0)  # no queue: his subscriptions are his own
            assert [[int(c.value) for c in codes] for codes in carol.suback] == [[1]]
            assert [[int(c.value) for c in codes] for codes in dave.suback] == [[0x87], [0]]
            queues = (await status(node))["guaranteed"]["queues"]
            assert [(q["vpn"], q["patterns"]) for q in queues] == [("team-a", ["orders.#"])]
            assert (await status(node))["vpns"]["team-a"]["violations"] == {"dave": 1}

            carol.close()  # her session keeps its queue: what comes meanwhile waits for her
            for i in range(3):
                await publish_qos1(pub, "orders/eu", b"kept-%d" % i)
            await eventually(lambda: len(dave.payloads()) == 3, timeout=10, what="dave's QoS 0 copies")
            carol = await connected(as_user(Paho(port, "carol-1", v5=True, clean=False), "carol"))
            await eventually(
                lambda: carol.payloads() == [b"kept-0", b"kept-1", b"kept-2"],
                timeout=15,
                what="carol's session queue delivered after she came back",
            )

            # A reload that denies her reading mqtt-* cuts her (her permissions changed); back, her
            # session's QoS 1 filter comes back at QoS 0: what waits in the queue stays there.
            vpns.write_text(vpn_file(hashed, carol_reads=False))
            async with aiohttp.ClientSession() as http, http.post(f"{node.url}/mesh/vpns/reload") as answer:
                assert answer.status == 200, await answer.text()
            await eventually(lambda: bool(carol.disconnects), timeout=10, what="carol cut by the reload")
            carol.close()
            await publish_qos1(pub, "orders/eu", b"waits")
            carol = await connected(as_user(Paho(port, "carol-1", v5=True, clean=False), "carol"))

            async def carol_refused() -> bool:
                return "carol" in (await status(node))["vpns"]["team-a"]["violations"]

            await eventually(carol_refused, timeout=10, what="carol's refused read counted")
            await publish_qos1(pub, "orders/eu", b"live")
            await eventually(lambda: b"live" in carol.payloads(), timeout=10, what="carol's QoS 0 copy")
            assert b"waits" not in carol.payloads()
        finally:
            for client in (carol, dave, pub):
                client.close()
