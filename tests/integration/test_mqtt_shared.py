"""MQTT shared subscriptions (``$share/{group}/{filter}``) on the MQTT door, with paho clients on
real nodes: one member of a group, on whatever node, gets each message."""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter

import pytest

from meshplane.core.doors.mqtt_packets import V5, V311, Connect, Subscribe, encode
from meshplane.launchers import MeshCluster
from tests.helpers import eventually
from tests.integration import test_mesh_mqtt
from tests.integration.test_mesh_mqtt import read_packets
from tests.support.mesh import interest_reached, status
from tests.support.mqtt import Paho, connected, subscribed

MARKER = "$MQ.workers.jobs.*"  # what a node with members of ``workers`` on ``jobs/+`` announces


trio = test_mesh_mqtt.trio  # the fixture: three nodes with MQTT doors


async def test_a_shared_subscription_over_three_nodes_gets_each_message_once(
    trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = trio
    await asyncio.to_thread(cluster.wait_linked)
    members = [
        await connected(Paho(ports["a"], "member-a", v5=True)),
        await connected(Paho(ports["b"], "member-b", v5=True)),
        await connected(Paho(ports["c"], "member-c")),  # 3.1.1 takes $share too, as mosquitto does
    ]
    everything = await connected(Paho(ports["c"], "everything"))
    publisher = await connected(Paho(ports["a"], "publisher"))
    try:
        for member in members:
            await subscribed(member, "$share/workers/jobs/+", 1)
            assert [getattr(c, "value", c) for c in member.suback[-1]] == [1]
        await subscribed(everything, "jobs/#", 1)
        for node in "abc":
            for peer in set("abc") - {node}:
                await interest_reached(cluster[node], peer, MARKER)
        sent = [b"job %d" % i for i in range(90)]
        for body in sent:
            info = publisher.client.publish("jobs/build", body, qos=1)
            await asyncio.to_thread(info.wait_for_publish, 10)
        await eventually(lambda: len(everything.payloads()) == len(sent), timeout=20, what="'jobs/#'")

        def shared_out() -> list[bytes]:
            return [body for member in members for body in member.payloads()]

        await eventually(lambda: len(shared_out()) >= len(sent), timeout=20, what="the group's members")
        counts = Counter(shared_out())
        assert sorted(counts) == sorted(sent)  # none lost ...
        assert set(counts.values()) == {1}  # ... each once
        assert sum(1 for member in members if member.payloads()) >= 2  # spread over the nodes
        assert {m[2] for member in members for m in member.messages} == {1}  # at the QoS granted
        answer = await status(cluster["a"])
        assert answer["mqtt"]["shared_subscriptions"] == [
            {"group": "workers", "pattern": "jobs.*", "members": 1}
        ]

        members[0].client.unsubscribe("$share/workers/jobs/+")  # the group goes on without it
        await interest_reached(cluster["b"], "a", MARKER, present=False)
        await interest_reached(cluster["c"], "a", MARKER, present=False)
        before = len(shared_out())
        for i in range(20):
            info = publisher.client.publish("jobs/build", b"later %d" % i, qos=1)
            await asyncio.to_thread(info.wait_for_publish, 10)
        await eventually(lambda: len(shared_out()) >= before + 20, timeout=20, what="the two left")
        assert not [b for b in members[0].payloads() if b.startswith(b"later")]
        assert len(shared_out()) == before + 20
    finally:
        for client in (*members, everything, publisher):
            client.close()


BAD_SHARES = ("$share//jobs", "$share/w+/jobs", "$share/w#/jobs", "$share/w", "$share/w/", "$share/w/a/#/b")


@pytest.mark.parametrize("level", [V5, V311])
async def test_bad_shared_filters_get_suback_0x8f_and_the_client_serves_on(
    trio: tuple[MeshCluster, dict[str, int]], level: int
) -> None:
    """Raw packets: paho refuses to send most of these filters itself."""
    _, ports = trio

    def subscribe() -> list[tuple[int, int, bytes]]:
        with socket.create_connection(("127.0.0.1", ports["a"]), timeout=10) as sock:
            sock.sendall(encode(Connect(level, "bad-share"), level))
            filters = (*((f, 1) for f in BAD_SHARES), ("$share/ok/jobs/#", 1))
            sock.sendall(encode(Subscribe(7, filters), level))
            return read_packets(sock, 2)

    (_, _, _), (kind, _, body) = await asyncio.to_thread(subscribe)
    assert kind == 9  # SUBACK
    codes = list(body[3:] if level == V5 else body[2:])  # after the packet id (and 5's properties)
    assert codes == [0x8F if level == V5 else 0x80] * len(BAD_SHARES) + [1]


async def test_a_share_whose_marker_the_mesh_cannot_carry_is_refused(
    trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    """The group's marker (``$MQ.GROUP.`` before the pattern) must fit a frame's subject: a filter the
    mesh carries plain (``$mqtt.`` before it: 6 bytes, one level) is refused shared when the marker
    passes 1024 bytes or 32 levels, granted when it just fits; nothing is announced for a refused one."""
    cluster, ports = trio
    long_level = "x" * (1024 - len("$mqtt."))  # plain: exactly at the limit with $mqtt. in front
    many_levels = "/".join(["l"] * 31)  # plain: 32 levels with $mqtt.; shared: 33 with $MQ.gg.
    filters = (
        (long_level, 1),
        (many_levels, 1),
        (f"$share/g/{long_level}", 1),  # $MQ.g. is 6 bytes: fits
        (f"$share/gg/{long_level}", 1),  # 7: one byte past
        (f"$share/gg/{many_levels}", 1),
        ("$share/ok/jobs/#", 1),
    )

    with socket.create_connection(("127.0.0.1", ports["a"]), timeout=10) as sock:
        sock.sendall(encode(Connect(V311, "long-share"), V311))
        sock.sendall(encode(Subscribe(7, filters), V311))
        (_, _, _), (kind, _, body) = await asyncio.to_thread(read_packets, sock, 2)
        assert kind == 9  # SUBACK
        assert list(body[2:]) == [1, 1, 1, 0x80, 0x80, 1]
        groups = json.dumps((await status(cluster["a"]))["mqtt"]["shared_subscriptions"])
        assert '"ok"' in groups
        assert '"gg"' not in groups


async def test_a_shared_subscription_gets_no_retained_messages_and_no_local_is_refused(
    trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    _, ports = trio
    pub = await connected(Paho(ports["a"], "retainer"))
    member = await connected(Paho(ports["a"], "member", v5=True))
    try:
        info = pub.client.publish("jobs/config", b"retained", qos=1, retain=True)
        await asyncio.to_thread(info.wait_for_publish, 10)
        await subscribed(member, "$share/r/jobs/+", 1)
        marker = pub.client.publish("jobs/marker", b"after", qos=1)  # retained ones would come first
        await asyncio.to_thread(marker.wait_for_publish, 10)
        await eventually(lambda: bool(member.messages), timeout=10, what="the marker")
        assert member.payloads() == [b"after"]  # MQTT 5 section 4.8.2: no retained messages
    finally:
        pub.close()
        member.close()

    def no_local() -> list[tuple[int, int, bytes]]:
        with socket.create_connection(("127.0.0.1", ports["a"]), timeout=10) as sock:
            sock.sendall(encode(Connect(V5, "no-local"), V5))
            sock.sendall(encode(Subscribe(3, (("$share/g/jobs/+", 1 | 4),)), V5))
            return read_packets(sock, 2)

    (_, _, _), (kind, _, body) = await asyncio.to_thread(no_local)
    assert (kind, body[0]) == (14, 0x82)  # DISCONNECT, protocol error (MQTT 5 section 3.8.3.1)
