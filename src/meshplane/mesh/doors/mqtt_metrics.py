"""The MQTT door on ``/metrics`` (``meshplane_mesh_mqtt_*``), read from the door at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from meshplane.mesh.doors.mqtt import MqttDoor

PREFIX = "meshplane_mesh_mqtt_"


class MqttCollector(Collector):
    def __init__(self, door: MqttDoor) -> None:
        self.door = door

    def collect(self) -> Iterator[Metric]:
        door = self.door
        yield GaugeMetricFamily(PREFIX + "clients", "MQTT clients connected", value=len(door.connections))
        sessions = len(door.sessions.by_key) if door.sessions is not None else 0
        yield GaugeMetricFamily(PREFIX + "sessions", "Persistent MQTT sessions kept", value=sessions)
        yield GaugeMetricFamily(PREFIX + "retained", "Retained MQTT messages", value=door.retained.count)
        refused = CounterMetricFamily(
            PREFIX + "retained_refused",
            "Retained PUBLISHes not kept: their VPN's share of the node's retained messages was full",
            labels=["vpn"],
        )
        for vpn, value in sorted(door.retained.refused.items()):
            refused.add_metric([vpn], value)
        yield refused
        connections = door.connections.values()
        yield CounterMetricFamily(
            PREFIX + "messages_in",
            "PUBLISHes from connected MQTT clients",
            value=sum(c.messages_in for c in connections),
        )
        yield CounterMetricFamily(
            PREFIX + "messages_out",
            "PUBLISHes to connected MQTT clients",
            value=sum(c.messages_out for c in connections),
        )
        events = CounterMetricFamily(
            PREFIX + "events",
            "What the MQTT door counted (connections, refusals, errors by reason)",
            labels=["event"],
        )
        for what, value in sorted(door.counters.items()):
            events.add_metric([what], value)
        yield events
