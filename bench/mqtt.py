"""MQTT with paho-mqtt against Debian's mosquitto broker and against a meshplane node's MQTT door, in
the same run, one server each (issue 59's benchmark).

The same paho clients (a publisher and a subscriber, each its own process, 100 QoS 1 messages in flight:
paho's fastest window here; it slows down with more)
send ``--count`` messages of 100 B through each server; a run lasts from the publisher's first PUBLISH
until the subscriber has them all (and, at QoS 1, the publisher has every PUBACK). Kinds:

- ``qos0``: QoS 0 both ways (mosquitto: in memory; meshplane: direct events);
- ``qos1``: QoS 1 publisher and subscriber with a clean session. mosquitto's PUBACK: the message is in
  the broker's memory (Debian's configuration, ``persistence true``, writes its store every 30 minutes
  and at shutdown: a crash loses everything since). meshplane's: the guaranteed event is stored
  wherever a queue wants it, and no queue does: at once, like mosquitto's;
- ``qos1-session``: the subscriber has a persistent session. mosquitto: queued in memory as above.
  meshplane: the session is a queue, so each PUBACK waits until the message is written in it (fsync
  every 10 ms, the node's default ``--fsync interval``): a SIGKILL of the node loses nothing acknowledged;
- ``qos1-ws``: ``qos1`` with both paho clients over WebSocket (``transport="websockets"``, the node's
  ``--mqtt-ws-port``). Debian's mosquitto (2.0.11) is built without websockets (its ``protocol
  websockets`` listener fails to start), so the other side is not mosquitto but paho over TCP to the same
  node: the ratio is what the WebSocket costs, ws/tcp.

Rounds interleave the two servers; the ratio is the median of per-round ratios (meshplane/mosquitto).
Each run also reads the server process's CPU time (``/proc``): the paho clients are the bottleneck and
share the machine's cores with the server, so a server's CPU per message is what it takes from them,
and a steadier figure than the rates on a shared machine.

With ``--base-src DIR`` (another checkout's ``src``, e.g. ``git archive main src | tar -x -C /tmp/main``,
its compiled extensions copied in), a third side, ``base``, is a node running that code: an A/B of the
door's own changes in the same run, with the same clients.

    python bench/mqtt.py [--count N] [--rounds R] [--kinds qos1,qos1-ws] [--base-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import add_out, emit, median_ratio, rate, write_results
from meshplane.launchers import StreamsServerProcess, free_port

BODY = b"x" * 100
WINDOW = 100
# (QoS, clean session)
KINDS = {"qos0": (0, True), "qos1": (1, True), "qos1-session": (1, False), "qos1-ws": (1, True)}
WS_KINDS = {"qos1-ws"}  # meshplane over WebSocket against meshplane over TCP


def child(role: str, port: int, qos: int, clean: bool, count: int, tag: str, transport: str) -> None:
    """A paho client in its own process: ``sub`` says ready once subscribed, then when it has all;
    ``pub`` publishes them all and says when every PUBACK is in."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    done = threading.Event()
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        f"bench-{role}-{tag}",
        clean_session=clean,
        transport="websockets" if transport == "websockets" else "tcp",
    )  # over websockets: paho's default path, /mqtt
    client.max_inflight_messages_set(WINDOW)
    ready = threading.Event()
    received = [0]

    def on_message(c: Any, u: Any, message: Any) -> None:
        received[0] += 1
        if received[0] == count:
            done.set()

    client.on_message = on_message
    client.on_subscribe = lambda *args: ready.set()

    def on_connect(*args: Any) -> None:
        if role == "pub":
            ready.set()
        else:
            client.subscribe(f"bench/{tag}/#", qos)

    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    ready.wait(30)
    if role == "sub":
        emit({"ready": True})
        done.wait(600)
        emit({"last": time.time(), "received": received[0]})
    else:
        acked = [0]
        room = threading.Semaphore(WINDOW)

        def on_publish(*args: Any) -> None:
            acked[0] += 1
            room.release()
            if acked[0] == count:
                done.set()

        client.on_publish = on_publish
        started = time.time()
        for _ in range(count):
            if qos:
                room.acquire()
            client.publish(f"bench/{tag}/m", BODY, qos)
        done.wait(600)
        emit({"started": started, "acked": acked[0], "acks_in": time.time()})
    client.disconnect()
    client.loop_stop()


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--child", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
    )


def line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    text = proc.stdout.readline()
    if not text:
        raise RuntimeError("a benchmark client ended without answering")
    answer: dict[str, Any] = json.loads(text)
    return answer


def one_run(port: int, kind: str, count: int, tag: str, transport: str = "tcp") -> float:
    qos, clean = KINDS[kind]
    sub = spawn("sub", str(port), str(qos), str(int(clean)), str(count), tag, transport)
    line(sub)
    pub = spawn("pub", str(port), str(qos), str(int(clean)), str(count), tag, transport)
    published, received = line(pub), line(sub)
    pub.wait(30)
    sub.wait(30)
    if received["received"] != count or (qos and published["acked"] != count):
        raise RuntimeError(f"{kind} on port {port}: {received} {published}")
    return rate(count, max(received["last"], published["acks_in"]) - published["started"])


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mosquitto(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = directory / "mosquitto.conf"
    # Debian's /etc/mosquitto/mosquitto.conf, but its own port and folder: persistence as Debian ships it
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {directory}/\nmax_inflight_messages 100\nmax_queued_messages 100000\n"
    )
    proc = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help="which kinds to run, comma-separated")
    parser.add_argument("--base-src", help="a third side: a node running the code of this src folder")
    parser.add_argument(
        "--child", nargs=7, metavar=("ROLE", "PORT", "QOS", "CLEAN", "COUNT", "TAG", "TRANSPORT")
    )
    add_out(parser, "mqtt")
    args = parser.parse_args()
    if args.child:
        role, port, qos, clean, count, tag, transport = args.child
        child(role, int(port), int(qos), bool(int(clean)), int(count), tag, transport)
        return
    with tempfile.TemporaryDirectory() as tmp:
        broker, broker_port = mosquitto(Path(tmp))
        mqtt_port = free_port()
        node = StreamsServerProcess(
            data_dir=Path(tmp) / "node",
            extra_args=(
                *("--node-id", "a", "--route-port", "0", "--mqtt-port", str(mqtt_port)),
                *("--mqtt-ws-port", "0"),
            ),
        )
        node.start()
        assert node.proc is not None
        servers = {"mosquitto": (broker_port, broker.pid), "meshplane": (mqtt_port, node.proc.pid)}
        over_ws = {  # the WebSocket kinds' sides: (port, pid, transport)
            "meshplane": (node.door_port("mqtt_ws"), node.proc.pid, "websockets"),
            "meshplane-tcp": (mqtt_port, node.proc.pid, "tcp"),
        }
        base = None
        if args.base_src:
            base_port = free_port()
            base = StreamsServerProcess(
                data_dir=Path(tmp) / "base",
                extra_args=("--node-id", "a", "--route-port", "0", "--mqtt-port", str(base_port)),
                env={"PYTHONPATH": str(Path(args.base_src).resolve())},
            )
            base.start()
            assert base.proc is not None
            servers["base"] = (base_port, base.proc.pid)
        kinds = args.kinds.split(",")
        over_tcp = {side: (port, pid, "tcp") for side, (port, pid) in servers.items()}
        sides = {kind: over_ws if kind in WS_KINDS else over_tcp for kind in kinds}
        rounds: dict[str, dict[str, list[float]]] = {k: {side: [] for side in sides[k]} for k in kinds}
        cpu: dict[str, dict[str, list[float]]] = {k: {side: [] for side in sides[k]} for k in kinds}
        try:
            for round_number in range(args.rounds):
                for kind in kinds:
                    for side, (port, pid, transport) in sides[kind].items():
                        tag = f"{kind}-{round_number}"
                        before = cpu_seconds(pid)
                        events = one_run(port, kind, args.count, tag, transport)
                        micros = round((cpu_seconds(pid) - before) / args.count * 1e6, 1)
                        rounds[kind][side].append(events)
                        cpu[kind][side].append(micros)
                        print(
                            f"round {round_number} {kind:13} {side:13} {events:>10,.0f} msg/s "
                            f"{micros:6.1f} us CPU/msg",
                            flush=True,
                        )
        finally:
            node.stop()
            if base is not None:
                base.stop()
            broker.terminate()
            broker.wait(10)
    results: dict[str, Any] = {
        "count": args.count,
        "body_bytes": len(BODY),
        "python": platform.python_version(),
        "kinds": {},
    }
    for kind, measured in rounds.items():
        other = "meshplane-tcp" if kind in WS_KINDS else "mosquitto"
        ratio = median_ratio(measured["meshplane"], measured[other])
        cpu_us = {side: sorted(values)[len(values) // 2] for side, values in cpu[kind].items()}
        results["kinds"][kind] = {**measured, "ratio": ratio, "server_cpu_us_per_msg_median": cpu_us}
        if "base" in measured:
            results["kinds"][kind]["ratio_to_base"] = median_ratio(measured["meshplane"], measured["base"])
            print(f"{kind:13} meshplane/base: {results['kinds'][kind]['ratio_to_base']}x (per-round median)")
        print(
            f"{kind:13} meshplane/{other}: {ratio}x (per-round median); server CPU per message "
            f"(median): meshplane {cpu_us['meshplane']} us, {other} {cpu_us[other]} us"
        )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
