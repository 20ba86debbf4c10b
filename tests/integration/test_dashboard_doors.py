"""The dashboard's mesh section lists the doors' clients, MQTT's and NATS's (issue 59), in a real chromium."""

from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import requests
from paho.mqtt.enums import CallbackAPIVersion
from playwright.sync_api import Page

from meshplane.launchers import MeshCluster
from tests.integration.test_dashboard_browser import WAIT_MS, browser, page, playwright

__all__ = ["browser", "page", "playwright"]  # the browser test's fixtures, used here


def test_the_event_plane_page_lists_the_mqtt_doors_clients(page: Page) -> None:
    with MeshCluster(1, cluster="dash", node_args={"a": ("--mqtt-port", "0")}) as mesh:
        mesh.start()
        port = requests.get(mesh["a"].url + "/mesh", timeout=5).json()["mqtt"]["port"]
        client = mqtt.Client(CallbackAPIVersion.VERSION2, "sensor-7")
        client.connect("127.0.0.1", port)
        client.loop_start()
        try:
            page.goto(mesh["a"].url + "/ui/plane")
            page.wait_for_selector("#mesh tr[data-mqtt-client=sensor-7]", timeout=WAIT_MS)
            assert "3.1.1" in page.inner_text("#mesh tr[data-mqtt-client=sensor-7]")
            page.goto("about:blank")  # leave before the node stops
        finally:
            client.disconnect()
            client.loop_stop()


def test_the_event_plane_page_lists_the_nats_doors_clients(page: Page) -> None:
    with MeshCluster(1, cluster="dash", node_args={"a": ("--nats-port", "0")}) as mesh:
        mesh.start()
        port = requests.get(mesh["a"].url + "/mesh", timeout=5).json()["nats"]["port"]
        # A NATS client by hand (the browser's sync API owns this thread): CONNECT, SUB, PING -> PONG.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as nc:
            nc.makefile("rb").readline()  # INFO
            nc.sendall(b'CONNECT {"name":"billing-7","verbose":false}\r\nSUB invoices.> 1\r\nPING\r\n')
            assert nc.makefile("rb").readline() == b"PONG\r\n"
            page.goto(mesh["a"].url + "/ui/plane")
            page.wait_for_selector("#mesh tr[data-nats-client]", timeout=WAIT_MS)
            row = page.inner_text("#mesh tr[data-nats-client]")
            assert "billing-7" in row
            assert "127.0.0.1" in row
            page.goto("about:blank")  # leave before the node stops
