"""Every failure of the meshplane command a newcomer met is one line with what to do, and an exit
code that says what kind of failure it was (documented in meshplane.cli.errors)."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshplane import EventPlane, Scope
from meshplane.launchers import NatsServer, StreamsServerProcess
from tests.conftest import make_config
from tests.support.cli import MESHPLANE, plane_env

TOKEN = "right-token"


def meshplane(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MESHPLANE, *args], capture_output=True, text=True, timeout=60, env=env, input=stdin
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("meshplane: error:")]
    assert len(errors) == 1, result.stderr
    assert message in errors[0], errors[0]


@pytest.fixture(scope="module")
def server() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess(env={"MESHPLANE_STREAMS_TOKEN": TOKEN}) as proc:
        yield proc.start()


@pytest.fixture
def not_meshplane() -> Iterator[str]:
    """An HTTP server that is something else: it answers HTML."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
        httpd.shutdown()


def test_bad_json_is_bad_input(tmp_path: Path) -> None:
    env = plane_env(tmp_path)
    assert_one_line_error(meshplane("pub", "a/b/c", "t", "{bad json", "--json", env=env), 2, "not valid JSON")
    created = meshplane("topic", "create", "t", "--retention", "{bad", env=env)
    assert_one_line_error(created, 2, "--retention is not valid JSON")
    published = meshplane("topic", "publish", "t", "e", "{bad json", env=env)
    assert_one_line_error(published, 2, "DATA is not valid JSON")


def test_a_bad_zmq_address_is_bad_input(tmp_path: Path) -> None:
    result = meshplane("broker-stats", "not-an-address", env=plane_env(tmp_path))
    assert_one_line_error(result, 2, "addresses look like tcp://host:port")


def test_waiting_for_subscribers_that_never_come_is_a_timeout(tmp_path: Path) -> None:
    result = meshplane(
        "pub", "a/b/c", "t", "x", "--wait-subscribers", "1", "--timeout", "0.5", env=plane_env(tmp_path)
    )
    assert_one_line_error(result, 3, "0 of 1 subscribers connected after 0.5s")


def test_a_server_that_is_not_meshplane_is_named(tmp_path: Path, not_meshplane: str) -> None:
    result = meshplane("topic", "list", "--url", not_meshplane, env=plane_env(tmp_path))
    assert_one_line_error(result, 2, "is it a meshplane streams server?")


def test_refused_credentials_are_called_so(tmp_path: Path, server: StreamsServerProcess) -> None:
    wrong = {**plane_env(tmp_path), "MESHPLANE_STREAMS_TOKEN": "wrong"}
    for args in (("topic", "list"), ("stream", "tail", "room")):
        result = meshplane(*args, "--url", server.url, env=wrong)
        assert_one_line_error(result, 4, "authentication failed: 401 Unauthorized")
    with NatsServer(token=TOKEN) as nats:
        nats.start()
        env = {
            **plane_env(tmp_path, "nats"),
            "NATS_SERVER": f"nats://wrong@127.0.0.1:{nats.port}",
            "MESHPLANE_CONNECT_TIMEOUT": "2",
        }
        result = meshplane("pub", "a/b/c", "t", "x", env=env)
        assert_one_line_error(result, 4, "refused the credentials")
        assert "wrong" not in result.stderr  # credentials never printed


def test_a_url_without_scheme_and_the_partitions_flag_work(
    tmp_path: Path, server: StreamsServerProcess
) -> None:
    env = {**plane_env(tmp_path), "MESHPLANE_STREAMS_TOKEN": TOKEN}
    host_port = server.url.removeprefix("http://")
    missing = meshplane("group", "create", "g", "not-yet", "--url", host_port, env=env)
    assert_one_line_error(missing, 2, "--partitions")
    made = meshplane("group", "create", "g", "not-yet", "--partitions", "2", "--url", host_port, env=env)
    assert made.returncode == 0, made.stderr
    bad = meshplane("topic", "list", "--url", "ftp://x", env=env)
    assert bad.returncode == 2
    assert "is not a streams server URL" in bad.stderr


def test_the_version_and_a_bare_command_help(tmp_path: Path) -> None:
    version = meshplane("--version", env=plane_env(tmp_path))
    assert version.returncode == 0
    assert version.stdout.startswith("meshplane ")
    bare = meshplane(env=plane_env(tmp_path))
    assert bare.returncode == 2
    assert "usage: meshplane" in bare.stdout + bare.stderr
    assert "COMMAND" in bare.stdout + bare.stderr


async def test_sub_follows_a_component_scope_and_says_why_nothing_comes(tmp_path: Path) -> None:
    config = make_config("zmq", "file", tmp_path, None, None)
    env = plane_env(tmp_path)
    async with EventPlane(config) as plane:
        publishers = [
            await plane.publisher(Scope.endpoint("ns", "comp", ep), "kv-events") for ep in ("a", "b")
        ]
        typo = await asyncio.create_subprocess_exec(
            *MESHPLANE,
            "sub",
            "ns/comp",
            "kv-event",
            "--timeout",
            "0.5",
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        _, typo_err = await typo.communicate()
        assert typo.returncode == 1
        assert (
            "no publisher of kv-event in ns/comp or below; did you mean topic kv-events?" in typo_err.decode()
        )
        assert "no event for 0.5s" in typo_err.decode()

        sub = await asyncio.create_subprocess_exec(
            *MESHPLANE,
            "sub",
            "ns/comp",
            "kv-events",
            "--count",
            "2",
            "--json",
            "--timeout",
            "30",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        for pub in publishers:
            await pub.wait_for_subscribers(1, timeout=30)
            await pub.publish(f"from {pub.scope}")
        out, err = await asyncio.wait_for(sub.communicate(), 60)
    assert sub.returncode == 0, err.decode()
    assert "kv-events: 2 publisher(s) in ns/comp/a (1), ns/comp/b (1)" in err.decode()
    assert sorted(json.loads(line)["payload"] for line in out.decode().splitlines()) == [
        "from ns/comp/a",
        "from ns/comp/b",
    ]
