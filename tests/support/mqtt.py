"""MQTT in tests: a paho-mqtt client on its own network thread, recording what it receives."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.helpers import eventually


class Paho:
    """A paho-mqtt client on its own network thread, recording what it receives."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        v5: bool = False,
        clean: bool = True,
        will: tuple[str, bytes] | None = None,
        websocket: bool = False,
    ) -> None:
        self.port = port
        self.messages: list[tuple[str, bytes, int, bool, bool]] = []  # topic, payload, qos, retain, dup
        self.expiry: list[int | None] = []  # each message's Message Expiry Interval (5)
        self.lock = threading.Lock()
        self.suback: list[list[Any]] = []  # each SUBACK's reason codes
        self.connack: list[tuple[bool, Any]] = []  # (session present, reason code)
        self.disconnects: list[Any] = []
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        session = None if v5 else clean  # 5 says it at connect (clean_start)
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id,
            clean_session=session,
            protocol=protocol,
            transport="websockets" if websocket else "tcp",  # paho's default path: /mqtt
        )
        self.client.on_message = self._message
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.suback.append(codes)
        self.client.on_connect = lambda c, u, f, code, p: self.connack.append((f.session_present, code))
        self.client.on_disconnect = lambda c, u, f, code, p: self.disconnects.append(code)
        if will is not None:
            self.client.will_set(will[0], will[1], qos=1)
        self.v5, self.clean = v5, clean

    def _message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(
                (message.topic, bytes(message.payload), message.qos, message.retain, message.dup)
            )
            self.expiry.append(getattr(message.properties, "MessageExpiryInterval", None))

    def connect(self) -> Paho:
        properties = None
        if self.v5 and not self.clean:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 3600
        if self.v5:
            self.client.connect("127.0.0.1", self.port, clean_start=self.clean, properties=properties)
        else:
            self.client.connect("127.0.0.1", self.port)
        self.client.loop_start()
        return self

    def payloads(self) -> list[bytes]:
        with self.lock:
            return [m[1] for m in self.messages]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def connected(client: Paho) -> Paho:
    await asyncio.to_thread(client.connect)
    await eventually(lambda: bool(client.connack), timeout=10, what="CONNACK")
    return client


async def subscribed(client: Paho, topic: str, qos: int = 0) -> None:
    before = len(client.suback)
    client.client.subscribe(topic, qos)
    await eventually(lambda: len(client.suback) > before, timeout=10, what=f"SUBACK for {topic}")
