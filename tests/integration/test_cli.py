"""The command line, run as a user would: real processes, real servers."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from meshplane import EventPlane, Scope
from meshplane.launchers import StreamsServerProcess
from tests.conftest import make_config
from tests.helpers import read_until, wait_until
from tests.support.cli import MESHPLANE, plane_env


@pytest.mark.parametrize(("transport", "brokers"), [("nats", "0"), ("zmq", "0"), ("zmq", "2")])
def test_up_runs_a_local_plane_and_reports_what_flows(transport: str, brokers: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *MESHPLANE,
            "up",
            "--no-pipeline",
            "--brokers",
            brokers,
            "--transport",
            transport,
            "--state-dir",
            str(tmp_path),
            "--duration",
            "2.5",
            "--publishers",
            "2",
            "--rate",
            "100",
            "--interval",
            "0.5",
            "--streams-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=plane_env(tmp_path, transport),
    )
    assert result.returncode == 0, result.stderr
    assert "publishers heard 2" in result.stdout  # broker mode too: no false "0"
    assert ("(in discovery 2)" in result.stdout) == (brokers == "0")
    assert result.stdout.count("  broker: xsub tcp://127.0.0.1:") == int(brokers)
    assert re.search(r"  dashboard at http://127\.0\.0\.1:\d+/ui\n", result.stdout)
    stopped = re.search(
        r"stopped: (\d+) events received from 2 publishers, gaps 0, malformed 0", result.stdout
    )
    assert stopped, result.stdout
    assert int(stopped.group(1)) >= 200  # 2 publishers x 100/s x >= 1 s of traffic
    stored = [int(n) for n in re.findall(r"stored in demo-events (\d+)", result.stdout)]
    assert stored
    assert stored[-1] > 0
    if transport == "nats":
        pid = int(re.search(r"nats-server pid (\d+)", result.stdout).group(1))  # type: ignore[union-attr]
        assert not Path(f"/proc/{pid}").exists()  # the embedded server is stopped with `up`


@pytest.mark.timeout(150)  # its waits add up to 125 s
def test_ups_dashboard_shows_the_brokers_and_their_counters(tmp_path: Path) -> None:
    argv = [*MESHPLANE, "up", "--no-pipeline", "--transport", "zmq", "--brokers", "2", "--streams-port", "0"]
    argv += ["--state-dir", str(tmp_path), "--duration", "60", "--publishers", "2", "--rate", "50"]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=plane_env(tmp_path, "zmq"))
    try:
        assert up.stdout is not None
        found = re.search(
            r"dashboard at (\S+)/ui", read_until(up.stdout, r"dashboard at", 60, "up's dashboard")[-1]
        )
        assert found is not None
        url = found.group(1)
        plane: dict[str, Any] = {}

        def brokers_counted() -> bool:
            nonlocal plane
            plane = requests.get(f"{url}/ui/api/snapshot", timeout=5).json()["plane"]
            brokers = plane.get("brokers", [])
            return len(brokers) == 2 and all(b.get("counters", {}).get("frames_in", 0) > 0 for b in brokers)

        wait_until(brokers_counted, timeout=30, interval=0.5, what="both brokers' counters on the dashboard")
        assert plane["invalid_records"] == 0
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=30)


@pytest.mark.timeout(240)  # its waits add up to 215 s
def test_up_with_cluster_runs_on_three_jetstream_nodes_served_by_two_streams_servers(tmp_path: Path) -> None:
    argv = [*MESHPLANE, "up", "--cluster", "3", "--no-pipeline", "--streams-port", "0", "--nats-port", "0"]
    argv += ["--state-dir", str(tmp_path), "--duration", "120", "--publishers", "2", "--rate", "100"]
    argv += ["--context", "none"]
    env = {**plane_env(tmp_path, "nats"), "MESHPLANE_TOKEN": "up-s3cret"}
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        # the first status line: everything is started
        output = "".join(read_until(up.stdout, r"^up ", 120, "up --cluster's first status line"))
        nats_pids = [int(pid) for pid in re.findall(r"nats-server n\d \(JetStream\): pid (\d+)", output)]
        streams_urls = re.findall(r"streams server at (\S+) ", output)
        assert (len(nats_pids), len(streams_urls)) == (3, 2), output
        assert "up-s3cret" not in output
        assert "JetStream R3, fsync always" in output
        for pid in nats_pids:  # JetStream acknowledges only what it has fsynced (issue 36, item 4)
            argv_of_node = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            config = Path(argv_of_node[argv_of_node.index(b"-c") + 1].decode()).read_text()
            assert "sync_interval: always" in config
        second = streams_urls[1]
        headers = {"Authorization": "Bearer up-s3cret"}

        def stored_through_the_second() -> bool:
            answer = requests.get(f"{second}/topics/demo-events/stats", headers=headers, timeout=5)
            return answer.ok and sum(p["next_offset"] for p in answer.json()["partitions"]) > 100

        wait_until(stored_through_the_second, timeout=30, interval=0.2, what="demo events via the 2nd server")
        second_pid = re.findall(r"streams server at \S+ \(pid (\d+)", output)[0]
        with open(f"/proc/{second_pid}/cmdline", "rb") as cmdline:
            assert b"up-s3cret" not in cmdline.read()  # the storage URLs and token went by environment
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)
    assert up.returncode == 0, rest
    assert re.search(r"stopped: \d+ events received from 2 publishers, gaps 0, malformed 0", rest), rest
    assert not [pid for pid in nats_pids if Path(f"/proc/{pid}").exists()]  # every node is stopped


def test_up_with_nodes_runs_the_demo_through_a_mesh_and_stops_every_node(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *MESHPLANE,
            "up",
            "--nodes",
            "3",
            "--no-pipeline",
            "--state-dir",
            str(tmp_path),
            "--duration",
            "4",
            "--publishers",
            "3",
            "--rate",
            "100",
            "--interval",
            "0.5",
            "--streams-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=plane_env(tmp_path, "nats"),
    )
    assert result.returncode == 0, result.stderr
    assert "transport=mesh" in result.stdout
    assert "mesh 3 nodes, 6/6 links up" in result.stdout
    forwarded = [int(n) for n in re.findall(r"links up, (\d+) forwarded", result.stdout)]
    assert forwarded[-1] > 0  # two of the three publishers are on other nodes than the subscriber
    stopped = re.search(
        r"stopped: (\d+) events received from 3 publishers, gaps 0, malformed 0", result.stdout
    )
    assert stopped, result.stdout
    assert "meshplane mesh status   (node a" in result.stdout  # the context names node a
    assert "MESHPLANE_MESH_URL=http://127.0.0.1:" in result.stdout
    for pid in re.findall(r"mesh node [a-c]: pid (\d+)", result.stdout):
        assert not Path(f"/proc/{pid}").exists()  # every node is stopped with `up`


@pytest.mark.timeout(200)  # each of its commands has 60 s
def test_pub_reaches_sub_and_sub_prints_json(tmp_path: Path) -> None:
    env = plane_env(tmp_path)
    sub = subprocess.Popen(
        [*MESHPLANE, "sub", "ns/comp/ep", "kv-events", "--json", "--count", "3", "--timeout", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    pub = subprocess.run(
        [
            *MESHPLANE,
            "pub",
            "ns/comp/ep",
            "kv-events",
            '{"a": 1}',
            "[2]",
            "--json",
            "--count",
            "1",
            "--wait-subscribers",
            "1",
            "--timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert pub.returncode == 0, pub.stderr
    pub_lines = subprocess.run(
        [*MESHPLANE, "pub", "ns/comp/ep", "kv-events", "--wait-subscribers", "1"],
        input="plain text\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert pub_lines.returncode == 0, pub_lines.stderr
    out, err = sub.communicate(timeout=60)
    assert sub.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["payload"] for e in events] == [{"a": 1}, [2], "plain text"]
    assert {e["topic"] for e in events} == {"kv-events"}
    assert [e["sequence"] for e in events] == [0, 1, 0]
    publisher_ids = [re.search(r"as ([0-9a-f]+)", p.stderr).group(1) for p in (pub, pub_lines)]  # type: ignore[union-attr]
    assert [e["publisher_id"] for e in events] == [publisher_ids[0]] * 2 + [
        publisher_ids[1]
    ]  # hex everywhere


async def test_ls_lists_registered_publishers(tmp_path: Path) -> None:
    config = make_config("zmq", "file", tmp_path, None, None)
    async with EventPlane(config) as plane:
        pub = await plane.publisher(Scope.endpoint("ns", "comp", "ep"), "kv-events")
        proc = await asyncio.create_subprocess_exec(
            *MESHPLANE, "ls", stdout=asyncio.subprocess.PIPE, env=plane_env(tmp_path)
        )
        table, _ = await proc.communicate()
        proc = await asyncio.create_subprocess_exec(
            *MESHPLANE, "ls", "ns", "--json", stdout=asyncio.subprocess.PIPE, env=plane_env(tmp_path)
        )
        raw, _ = await proc.communicate()
    assert f"{pub.publisher_id:x}" in table.decode()
    assert pub.channel is not None
    assert str(pub.channel.zmq_endpoint) in table.decode()
    assert [json.loads(line)["instance_id"] for line in raw.decode().splitlines()] == [pub.publisher_id]


@pytest.mark.parametrize("command", ["up", "pub", "sub", "ls", "serve"])
def test_every_option_is_explained(command: str) -> None:
    result = subprocess.run([*MESHPLANE, command, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    options = set(re.findall(r"^\s+(--[a-z-]+)", result.stdout, re.MULTILINE)) - {"--help"}
    assert options
    from meshplane.cli.main import build_parser
    from meshplane.cli.options import subcommands

    parser = subcommands(build_parser())[command]
    for action in parser._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert (action.help or "").strip(), f"{command} {action.option_strings[-1]} has no description"


@pytest.mark.parametrize(
    ("args", "env", "message", "code"),
    [
        (["sub", "bad.scope", "t"], {}, "contains '.'", 2),
        (["sub", "a/b/c", "t"], {"DYN_EVENT_PLANE": "kafka"}, "DYN_EVENT_PLANE must be", 2),
        (
            ["pub", "a/b/c", "t", "x"],
            {
                "DYN_EVENT_PLANE": "nats",
                "NATS_SERVER": "nats://127.0.0.1:1",
                "MESHPLANE_CONNECT_TIMEOUT": "1",
            },
            "cannot connect to NATS",
            3,  # unreachable
        ),
    ],
)
def test_bad_input_is_a_clear_error(
    args: list[str], env: dict[str, str], message: str, code: int, tmp_path: Path
) -> None:
    result = subprocess.run(
        [*MESHPLANE, *args], capture_output=True, text=True, timeout=60, env={**plane_env(tmp_path), **env}
    )
    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_up_with_a_token_requires_it_and_never_prints_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *MESHPLANE,
            "up",
            "--no-pipeline",
            "--state-dir",
            str(tmp_path),
            "--duration",
            "1.5",
            "--publishers",
            "1",
            "--rate",
            "50",
            "--interval",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**plane_env(tmp_path, "nats"), "MESHPLANE_TOKEN": "s3cr3t-t0ken"},  # never on argv
    )
    assert result.returncode == 0, result.stderr
    assert "s3cr3t-t0ken" not in result.stdout + result.stderr
    assert "NATS_SERVER=nats://YOUR_TOKEN@127.0.0.1:" in result.stdout
    assert re.search(r"stopped: [1-9]\d* events received", result.stdout)


async def test_embedded_nats_server_rejects_clients_without_the_token() -> None:
    from meshplane import TransportError
    from meshplane.launchers import NatsServer
    from meshplane.transports.nats import connect_nats

    with NatsServer(token="s3cr3t") as server:
        server.start()
        client = await connect_nats(server.url, timeout=5)
        await client.close()
        with pytest.raises(TransportError) as error:
            await connect_nats(f"nats://127.0.0.1:{server.port}", timeout=2)
        assert "s3cr3t" not in str(error.value)


async def test_nats_server_may_list_several_servers_of_a_cluster() -> None:
    from meshplane.core.urls import redact_url
    from meshplane.launchers import NatsServer, free_port
    from meshplane.transports.nats import connect_nats

    with NatsServer(token="s3cr3t") as server:
        server.start()
        gone = f"nats://s3cr3t@127.0.0.1:{free_port()}"  # a node that is down: the next one is used
        client = await connect_nats(f"{gone},{server.url}", timeout=5)
        assert client.connected_url is not None
        assert client.connected_url.port == server.port
        await client.close()
        assert "s3cr3t" not in redact_url(f"{gone}, {server.url}")
        assert redact_url(f"{gone},{server.url}").count("***@") == 2


@pytest.mark.timeout(200)  # each of its commands has 60 s
def test_stream_topic_and_group_commands(tmp_path: Path) -> None:
    with StreamsServerProcess(data_dir=tmp_path / "data") as server:
        server.start()

        def run(*args: str) -> Any:
            result = subprocess.run(
                [*MESHPLANE, *args, "--url", server.url], capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 0, result.stderr
            return [json.loads(line) for line in result.stdout.splitlines()]

        assert run("stream", "publish", "cli-room", "greeting", '{"hello": "world"}') == [{"offset": 0}]
        assert run("stream", "publish", "cli-room", "greeting", "plain text") == [{"offset": 1}]
        history = run("stream", "history", "cli-room")[0]
        assert [e["data"] for e in history["events"]] == [{"hello": "world"}, "plain text"]
        tail = run("stream", "tail", "cli-room", "--from-offset", "-1", "--count", "1")
        assert [e["offset"] for e in tail] == [1]
        run("topic", "create", "cli-topic", "--partitions", "2")
        placed = run("topic", "publish", "cli-topic", "click", '{"x": 1}', "--key", "user-1")[0]
        consumed = run("topic", "consume", "cli-topic", "-e")
        assert [(e["partition"], e["data"]) for e in consumed] == [(placed["partition_id"], {"x": 1})]
        run("group", "create", "cli-group", "cli-topic", "--strategy", "sticky")
        member = run("group", "join", "cli-group", "--member-id", "m1")[0]
        assert member["partitions"] == [0, 1]
        run(
            "group",
            "commit",
            "cli-group",
            "1",
            "5",
            "--member-id",
            "m1",
            "--generation",
            str(member["generation"]),
        )
        assert run("group", "offset", "cli-group", "1") == [{"offset": 5}]
        stale = subprocess.run(
            [
                *MESHPLANE,
                "group",
                "commit",
                "cli-group",
                "1",
                "6",
                "--member-id",
                "m1",
                "--generation",
                "0",
                "--url",
                server.url,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stale.returncode == 2
        assert "stale" in stale.stderr
        assert "Traceback" not in stale.stderr
    gone = subprocess.run(
        [*MESHPLANE, "topic", "list", "--url", server.url], capture_output=True, text=True, timeout=60
    )
    assert gone.returncode == 3  # unreachable (meshplane.cli.errors)
    assert "cannot reach the streams server" in gone.stderr


@pytest.mark.timeout(260)  # its waits add up to 240 s
def test_a_second_up_in_the_same_folder_stops_with_one_line_naming_the_first(tmp_path: Path) -> None:
    """Issue 35's first finding: a second `make run` in the same folder wrote the same logs."""
    argv = [*MESHPLANE, "up", "--no-pipeline", "--streams-port", "0", "--state-dir", str(tmp_path)]
    argv += ["--transport", "zmq", "--duration", "60", "--publishers", "2", "--rate", "200"]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=plane_env(tmp_path, "zmq"))
    try:
        assert first.stdout is not None
        found = re.search(
            r"dashboard at (\S+/ui)", read_until(first.stdout, "dashboard at", 60, "the first up")[-1]
        )
        assert found is not None
        dashboard = found.group(1)
        second = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, env=plane_env(tmp_path, "zmq")
        )
        assert second.returncode != 0
        assert second.stderr.strip().count("\n") == 0, second.stderr  # one line
        assert f"pid {first.pid}" in second.stderr
        assert dashboard in second.stderr
        assert "--state-dir" in second.stderr
        assert "port" not in second.stdout  # it never got as far as starting servers
    finally:
        first.send_signal(signal.SIGINT)
        out, _ = first.communicate(timeout=60)
    assert first.returncode in (0, 130), out
    assert re.search(r"stopped: \d+ events received from 2 publishers, gaps 0", out)
    verify = subprocess.run(
        [*MESHPLANE, "log", "verify", "--data-dir", str(tmp_path / "streams")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not (tmp_path / "up.json").exists()  # the folder is free again


@pytest.mark.parametrize("columns", [60, 100])
def test_ups_status_line_fits_the_terminal(tmp_path: Path, columns: int) -> None:
    """Issue 57: `up`'s ~250-character status line, rewritten with \\r, piled up in a narrower terminal."""
    import fcntl
    import pty
    import struct
    import termios

    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    argv = [*MESHPLANE, "up", "--no-pipeline", "--state-dir", str(tmp_path), "--streams-port", "0"]
    argv += ["--nats-port", "0", "--duration", "3", "--interval", "0.3", "--context", "none"]
    env = {k: v for k, v in plane_env(tmp_path, "nats").items() if k not in ("COLUMNS", "LINES")}
    up = subprocess.Popen(argv, stdout=terminal, stderr=terminal, stdin=terminal, env=env)
    os.close(terminal)
    written = b""
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed: up has exited
                break
            if not chunk:
                break
            written += chunk
    finally:
        assert up.wait(timeout=60) == 0, written.decode(errors="replace")[-2000:]
        os.close(controller)
    text = written.decode(errors="replace")
    rewritten = [part.split("\x1b[K")[0] for line in text.split("\n") for part in line.split("\r")[1:]]
    status = [line for line in rewritten if line.startswith("up ")]
    assert len(status) >= 3, text[-2000:]
    assert all(len(line) < columns for line in status), [len(line) for line in status]
    assert all("events/s" in line for line in status)  # the first fields stay


@pytest.mark.timeout(240)  # its waits add up to 215 s
def test_a_mesh_nodes_dashboard_counts_ups_publishers_and_shows_link_addresses(tmp_path: Path) -> None:
    """Issue 57: a node of `up --nodes 3` showed "0 publishers registered" with 3 in discovery, and
    a Python tuple as a link's address."""
    argv = [*MESHPLANE, "up", "--no-pipeline", "--nodes", "3", "--state-dir", str(tmp_path)]
    argv += ["--streams-port", "0", "--publishers", "3", "--rate", "20", "--duration", "90"]
    # a user's shell: no discovery variables (up uses its state folder's, and so must its nodes)
    env = {k: v for k, v in plane_env(tmp_path, "nats").items() if not k.startswith("DYN_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "elsewhere")
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        printed = "".join(read_until(up.stdout, "as variables", 90, "up's next steps"))
        node_a = re.search(r"mesh node a: pid \d+, (http://\S+),", printed)
        assert node_a is not None, printed
        seen: dict[str, Any] = {}

        def snapshot() -> bool:
            seen.update(requests.get(f"{node_a[1]}/ui/api/snapshot", timeout=5).json())
            return bool(seen.get("plane", {}).get("publishers") == 3)

        wait_until(snapshot, timeout=60, interval=0.5, what="node a's dashboard lists the 3 demo publishers")
        addresses = [link["address"] for link in seen["mesh"]["links"]]
        assert len(addresses) == 2
        assert all(re.fullmatch(r"127\.0\.0\.1:\d+", address) for address in addresses), addresses
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
