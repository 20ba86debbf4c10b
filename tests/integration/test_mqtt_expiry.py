"""MQTT 5's Message Expiry Interval through the MQTT door (section 3.3.2.3.3), with paho clients on
real nodes: a QoS 1 message waiting in a persistent session's queue past its expiry is dropped and
counted; one delivered before carries the seconds it has left."""

from __future__ import annotations

import asyncio
import time

import nats
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from meshplane.core.doors.nats_protocol import wrap
from meshplane.launchers import MeshCluster
from tests.helpers import eventually
from tests.integration import test_mesh_mqtt
from tests.support.mesh import interest_reached, status
from tests.support.mqtt import Paho, connected, subscribed

trio = test_mesh_mqtt.trio  # the fixture: three nodes with MQTT doors


def expiring(seconds: int) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    properties.MessageExpiryInterval = seconds
    return properties


async def test_an_expired_message_waiting_in_a_session_is_dropped_and_the_rest_carry_what_is_left(
    trio: tuple[MeshCluster, dict[str, int]],
) -> None:
    cluster, ports = trio
    await asyncio.to_thread(cluster.wait_linked)
    keeper = await connected(Paho(ports["b"], "keeper", v5=True, clean=False))
    await subscribed(keeper, "alerts/#", 1)
    live = await connected(Paho(ports["c"], "live", v5=True))
    await subscribed(live, "alerts/#", 1)
    await interest_reached(cluster["a"], "b", "$G.alerts.#")  # the session's queue, known at a
    await interest_reached(cluster["a"], "c", "alerts.#")
    keeper.close()  # its session keeps what comes meanwhile
    pub = await connected(Paho(ports["a"], "alerts-pub", v5=True))
    try:
        sent_at = time.monotonic()
        for body, properties in ((b"short", expiring(3)), (b"long", expiring(3600)), (b"none", None)):
            info = pub.client.publish("alerts/fire", body, qos=1, properties=properties)
            await asyncio.to_thread(info.wait_for_publish, 10)
        await eventually(lambda: len(live.payloads()) == 3, timeout=15, what="the live subscriber")
        assert live.payloads() == [b"short", b"long", b"none"]
        short, long, none = live.expiry
        assert short is not None
        assert 0 < short <= 3
        assert long is not None
        assert 3500 < long <= 3600
        assert none is None

        await eventually(lambda: time.monotonic() > sent_at + 3.5, timeout=10, what="'short' expired")
        back = await connected(Paho(ports["b"], "keeper", v5=True, clean=False))
        assert back.connack[0][0]  # the session was there
        await eventually(lambda: len(back.payloads()) >= 2, timeout=15, what="the session's queue")
        assert back.payloads() == [b"long", b"none"]  # 'short' came first: it was passed over
        assert back.expiry[0] is not None
        assert 3500 < back.expiry[0] < 3600
        assert back.expiry[1] is None
        assert {m[2] for m in back.messages} == {1}
        assert (await status(cluster["b"]))["mqtt"]["counters"].get("expired") == 1
        back.close()
    finally:
        for client in (live, pub):
            client.close()


async def test_a_nats_clients_far_deadline_header_is_capped_and_breaks_no_delivery() -> None:
    """``Mqtt-Expires`` is an ordinary header to a NATS client: one of 19 digits must not make a
    Message Expiry Interval that does not fit MQTT's four bytes (it failed the delivery, and the
    MQTT subscriber got nothing of it); the interval is capped at the largest there is."""
    with MeshCluster(1, extra_args=("--nats-port", "0", "--mqtt-port", "0")) as cluster:
        cluster.start()
        doors = await status(cluster["a"])
        sub = await connected(Paho(doors["mqtt"]["port"], "far-sub", v5=True))
        nc = await nats.connect(f"nats://127.0.0.1:{doors['nats']['port']}")
        try:
            await subscribed(sub, "alerts/#", 0)
            await nc.publish("alerts.far", b"far", headers={"Mqtt-Expires": "9" * 19})
            await nc.publish("alerts.plain", b"plain")
            await nc.flush()
            await eventually(lambda: len(sub.payloads()) == 2, timeout=15, what="both messages")
            assert sub.payloads() == [b"far", b"plain"]
            assert sub.expiry == [0xFFFFFFFF, None]
        finally:
            sub.close()
            await nc.close()


async def test_a_payload_that_starts_like_an_envelope_reaches_a_session_as_it_was_sent() -> None:
    """A persistent session's QoS 1 messages come from its queue, which keeps no flags: a payload
    that began with the NATS door's envelope bytes was taken apart there (the subscriber got its
    tail, and the publisher could set its expiry), where a live subscriber got it whole."""
    with MeshCluster(1, extra_args=("--mqtt-port", "0")) as cluster:
        cluster.start()
        port = (await status(cluster["a"]))["mqtt"]["port"]
        keeper = await connected(Paho(port, "env-keeper", v5=True, clean=False))
        pub = await connected(Paho(port, "env-pub", v5=True))
        body = wrap("", b"NATS/1.0\r\nMqtt-Expires: 1\r\n\r\n", b"tail")  # expired long ago
        try:
            await subscribed(keeper, "blobs/#", 1)
            for each in (body, b"after"):
                info = pub.client.publish("blobs/x", each, qos=1)
                await asyncio.to_thread(info.wait_for_publish, 10)
            await eventually(lambda: b"after" in keeper.payloads(), timeout=15, what="the session's messages")
            assert keeper.payloads() == [body, b"after"]
        finally:
            keeper.close()
            pub.close()
