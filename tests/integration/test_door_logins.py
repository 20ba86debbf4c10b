"""The doors' logins and the node's Message VPNs: checks in the node's fair queue with the mesh's LOGINs
(a flood of wrong passwords through the NATS door from one address does not keep a user out at another,
through either door), and a reload cuts the doors' clients it no longer admits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path

import nats
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from meshplane.launchers import MeshCluster
from meshplane.mesh.vpns import hash_password
from tests.helpers import eventually
from tests.support.mesh import status

ALICE = "alice-correct-horse"


async def _guess(port: int, stop: asyncio.Event) -> None:
    """Wrong passwords for alice, from 127.0.0.2, over and over (raw NATS: INFO, CONNECT, answer)."""
    connect = json.dumps({"user": "A/alice", "pass": "guess", "verbose": False}).encode()
    while not stop.is_set():
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            try:
                await asyncio.wait_for(reader.readline(), 5)  # INFO
                writer.write(b"CONNECT " + connect + b"\r\nPING\r\n")
                await asyncio.wait_for(reader.read(), 30)  # -ERR and closed
            finally:
                writer.close()
        await asyncio.sleep(0.01)


def _mqtt_login(port: int) -> float:
    """Seconds for alice's MQTT CONNECT to be accepted (from 127.0.0.1)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="alice", protocol=mqtt.MQTTv311)
    client.username_pw_set("alice@A", ALICE)
    started = time.monotonic()
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    try:
        deadline = started + 60
        while not client.is_connected():
            assert time.monotonic() < deadline, "alice's MQTT login never answered"
            time.sleep(0.01)
        return time.monotonic() - started
    finally:
        client.loop_stop()
        client.disconnect()


async def test_a_flood_through_the_nats_door_keeps_no_user_out_of_either_door(tmp_path: Path) -> None:
    vpns = tmp_path / "vpns.toml"
    vpns.write_text(f'[vpns.A.users.alice]\npassword_hash = "{hash_password(ALICE)}"\n')
    args = ("--mesh-vpns", str(vpns), "--nats-port", "0", "--mqtt-port", "0")
    with MeshCluster(1, extra_args=args) as cluster:
        node = cluster.start()["a"]
        nats_port, mqtt_port = node.door_port("nats"), node.door_port("mqtt")

        async def nats_login() -> float:
            started = time.monotonic()
            nc = await nats.connect(
                f"nats://127.0.0.1:{nats_port}", user="A/alice", password=ALICE, connect_timeout=60
            )
            await nc.close()
            return time.monotonic() - started

        alone = min([await nats_login() for _ in range(3)])  # a handshake and one argon2 check
        stop = asyncio.Event()
        guesses = [asyncio.create_task(_guess(nats_port, stop)) for _ in range(200)]
        try:

            async def flooded() -> bool:
                return bool((await status(node))["vpns"]["A"]["logins_refused"] >= 200)

            await eventually(flooded, timeout=60, what="the flood's logins refused")
            through_nats = await nats_login()
            through_mqtt = await asyncio.to_thread(_mqtt_login, mqtt_port)
        finally:
            stop.set()
            await asyncio.gather(*guesses, return_exceptions=True)
        # alice's check waits for at most the flood's one of her name under way, not behind the flood
        # (before the doors shared the queue, the NATS door checked one at a time, first come first).
        # The factor is room for a loaded machine, not the claim.
        assert through_nats < max(1.0, 10 * alone), (through_nats, alone)
        assert through_mqtt < max(1.0, 10 * alone), (through_mqtt, alone)
        assert (await status(node))["vpns"]["A"]["logins_busy"] > 0  # the flood's surplus, unchecked


async def test_a_reload_cuts_the_door_clients_it_no_longer_admits_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    """SIGHUP with bob removed and carol's permissions changed: bob's NATS and MQTT clients are cut,
    told why, and so is carol's (the doors do not narrow subscriptions); alice's stay connected."""
    vpns = tmp_path / "vpns.toml"
    users = {name: hash_password(f"{name}-pw") for name in ("alice", "bob", "carol")}

    def write(names: tuple[str, ...], carol_publish: str) -> None:
        text = ""
        for name in names:
            text += f'[vpns.A.users.{name}]\npassword_hash = "{users[name]}"\n'
            if name == "carol":
                text += f'publish = {{ allow = ["{carol_publish}"] }}\n'
        vpns.write_text(text)

    write(("alice", "bob", "carol"), ">")
    args = ("--mesh-vpns", str(vpns), "--nats-port", "0", "--mqtt-port", "0")
    with MeshCluster(1, extra_args=args) as cluster:
        node = cluster.start()["a"]
        doors = await status(node)
        nats_url = f"nats://127.0.0.1:{doors['nats']['port']}"
        clients = {
            name: await nats.connect(nats_url, user=f"A/{name}", password=f"{name}-pw", allow_reconnect=False)
            for name in ("alice", "bob", "carol")
        }
        mqtt_bob = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bob-device", protocol=mqtt.MQTTv5)
        mqtt_bob.username_pw_set("bob@A", "bob-pw")
        reasons: list[str] = []
        mqtt_bob.on_disconnect = lambda c, u, flags, code, props: reasons.append(str(code))
        mqtt_bob.connect("127.0.0.1", doors["mqtt"]["port"])
        mqtt_bob.loop_start()
        try:
            await eventually(mqtt_bob.is_connected, what="bob's MQTT client connected")
            write(("alice", "carol"), "orders.>")
            node.kill(signal.SIGHUP)
            await eventually(lambda: clients["bob"].is_closed, what="bob's NATS client cut")
            await eventually(lambda: clients["carol"].is_closed, what="carol's NATS client cut")
            await eventually(lambda: bool(reasons), what="bob's MQTT client cut")
            assert reasons == ["Not authorized"]
            assert clients["alice"].is_connected
            await clients["alice"].flush()  # still served
            last = (await status(node))["vpns_reload"]["last"]
            assert last["closed"] == 3
            carol = await nats.connect(nats_url, user="A/carol", password="carol-pw", allow_reconnect=False)
            await carol.close()  # connects again, under the new permissions
        finally:
            mqtt_bob.loop_stop()
            for nc in clients.values():
                await nc.close()
