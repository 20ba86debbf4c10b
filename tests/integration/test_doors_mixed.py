"""Both doors on one mesh (issue 59): what an MQTT client publishes on node a reaches a NATS subscriber
on b, a queue and a MeshClient on c, and a NATS queue group spread over the three nodes gets each event
once. (Across gateways: test_mesh_mqtt.py's other cluster, test_nats_door.py's request/reply.)"""

from __future__ import annotations

import asyncio

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from meshplane.launchers import MeshCluster
from meshplane.mesh.client import MeshClient
from tests.helpers import eventually
from tests.support.mesh import Inbox, interest_reached, put_queue, queue_bodies, status
from tests.support.mqtt import Paho, connected


async def test_an_mqtt_publisher_reaches_nats_a_queue_a_mesh_client_and_a_queue_group_once() -> None:
    with MeshCluster(3, extra_args=("--nats-port", "0", "--mqtt-port", "0")) as cluster:
        cluster.start().wait_linked()
        doors = {node: (await status(cluster[node])) for node in "abc"}
        nats_url = {node: f"nats://127.0.0.1:{doors[node]['nats']['port']}" for node in "abc"}
        await put_queue(cluster["c"], "from-mqtt", ["fleet.>"])
        mesh = await MeshClient(cluster["c"].route_url).connect()
        inbox = Inbox()
        mesh.subscribe("fleet.>", inbox)
        await mesh.flush(propagated=True)
        plain: list[Msg] = []
        grouped: dict[str, list[Msg]] = {node: [] for node in "abc"}
        listeners = {node: await nats.connect(nats_url[node]) for node in "abc"}
        on_b = await nats.connect(nats_url["b"])
        publisher = None
        try:

            async def on_plain(msg: Msg) -> None:
                plain.append(msg)

            await on_b.subscribe("fleet.>", cb=on_plain)
            await on_b.flush()
            for node, nc in listeners.items():

                async def on_grouped(msg: Msg, node: str = node) -> None:
                    grouped[node].append(msg)

                await nc.subscribe("fleet.*.pos", queue="trackers", cb=on_grouped)
                await nc.flush()
            for pattern, holder in (("fleet.>", "b"), ("$G.fleet.>", "c"), ("fleet.>", "c")):
                await interest_reached(cluster["a"], holder, pattern)
            for node in "abc":  # every node knows every other node's members of the group
                for peer in set("abc") - {node}:
                    await interest_reached(cluster[node], peer, "$NQ.trackers.fleet.*.pos")
            publisher = await connected(Paho(doors["a"]["mqtt"]["port"], "truck"))
            bodies = [b"pos-%d" % i for i in range(60)]
            for body in bodies:  # QoS 1: each PUBACK once a's spool for c's queue has it
                info = publisher.client.publish("fleet/truck1/pos", body, qos=1)
                await asyncio.to_thread(info.wait_for_publish, 20)

            async def queued() -> bool:
                return len(await queue_bodies(cluster["c"], "from-mqtt")) >= len(bodies)

            await eventually(queued, timeout=20, what="the queue on c")
            assert await queue_bodies(cluster["c"], "from-mqtt") == bodies  # once each, in order
            await eventually(lambda: len(inbox.events) == len(bodies), timeout=20, what="the MeshClient on c")
            assert inbox.events == [("fleet.truck1.pos", b) for b in bodies]
            await eventually(lambda: len(plain) == len(bodies), timeout=20, what="the NATS subscriber on b")
            assert [(m.subject, m.data) for m in plain] == [("fleet.truck1.pos", b) for b in bodies]

            def group_total() -> int:
                return sum(len(msgs) for msgs in grouped.values())

            await eventually(lambda: group_total() >= len(bodies), timeout=20, what="the queue group")
            await publisher_flush(listeners)
            got = sorted(m.data for msgs in grouped.values() for m in msgs)
            assert got == sorted(bodies)  # each event once in the whole group
            assert sum(1 for msgs in grouped.values() if msgs) >= 2  # spread over the nodes
        finally:
            if publisher is not None:
                publisher.close()
            for nc in (*listeners.values(), on_b):
                await nc.close()
            await mesh.close()


async def publisher_flush(clients: dict[str, Client]) -> None:
    """A round trip with each member's node: what it was sent before is in (a late duplicate would be)."""
    for nc in clients.values():
        await nc.flush()
