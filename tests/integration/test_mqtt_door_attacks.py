"""Hostile MQTT clients against a real node's MQTT door: each test is an attack that once worked."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from meshplane.core.doors.mqtt_packets import V311, Connect, Publish, Subscribe, encode
from meshplane.launchers import MeshCluster

CONNACK_OK = b"\x20\x02\x00\x00"


def _connect(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(encode(Connect(V311, client_id), V311))
    assert sock.recv(4) == CONNACK_OK
    return sock


def _read_all(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(1 << 20):
                return
        except TimeoutError:
            continue
        except OSError:
            return


async def test_one_subscribe_matching_every_retained_message_many_times_does_not_hold_the_node() -> None:
    """10,000 retained topics, then one SUBSCRIBE of 1,000 filters (5 matching all of them, each 40
    times, and 800 one each): the node went deaf for tens of seconds while it looked 10 million matches
    up and encoded 2 million messages in one turn of its loop. Other clients must still be served (CONNACK
    within 5 s; the whole attack took 20 s of the loop on this machine)."""
    with MeshCluster(1, node_args={"a": ("--mqtt-port", "0")}) as cluster:
        port = cluster.start()["a"].door_port("mqtt")
        filler = await asyncio.to_thread(_connect, port, "filler")
        retained = b"".join(encode(Publish(f"r/{i}", b"x", 0, True), V311) for i in range(10_000))
        await asyncio.to_thread(filler.sendall, retained)
        probe = await asyncio.to_thread(_connect, port, "probe")  # after the retained publishes
        probe.sendall(encode(Subscribe(1, (("r/9999", 0),)), V311))
        seen = b""
        while b"r/9999" not in seen:  # the last retained message is kept: they all are
            seen += await asyncio.to_thread(probe.recv, 4096)
        attacker = await asyncio.to_thread(_connect, port, "attacker")
        stop = threading.Event()
        reader = threading.Thread(target=_read_all, args=(attacker, stop), daemon=True)
        reader.start()
        topics = ["#", "r/#", "+/+", "r/+", "+/#"] * 40 + [f"r/{i}" for i in range(800)]
        filters = tuple((f, 0) for f in topics)
        try:
            attacker.sendall(encode(Subscribe(2, filters), V311))
            await asyncio.sleep(0.5)  # the SUBSCRIBE is being answered
            started = time.monotonic()
            other = await asyncio.to_thread(_connect, port, "bystander")
            assert time.monotonic() - started < 5, "the node stopped serving during one SUBSCRIBE"
            other.close()
        finally:
            stop.set()
            reader.join(timeout=30)
            for sock in (filler, probe, attacker):
                sock.close()
