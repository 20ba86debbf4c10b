"""Issue 35, items 4 and 5: each path a new user tripped on ends in one line that says what to do (no
traceback, no log noise, no silent wait, no empty success), with the exit code of its kind."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.cli import pipeline
from meshplane.cli.errors import CliError
from meshplane.cli.main import build_parser
from meshplane.cli.options import subcommands
from meshplane.launchers import NatsServer, StreamsServerProcess
from tests.helpers import read_until
from tests.support.cli import MESHPLANE, plane_env


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess(data_dir=tmp_path_factory.mktemp("streams")) as server:
        server.start()
        yield server


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MESHPLANE, *args], capture_output=True, text=True, timeout=60, env=plane_env(tmp_path)
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("meshplane"), lines
    return lines[0]


def test_a_wrong_nats_url_is_one_line_with_the_reason_not_a_warning_a_second(tmp_path: Path) -> None:
    result = subprocess.run(
        [*MESHPLANE, "pub", "a/b/c", "t", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **plane_env(tmp_path, "nats"),
            "NATS_SERVER": "nats://127.0.0.1:1",
            "MESHPLANE_CONNECT_TIMEOUT": "3",
        },
    )
    assert result.returncode == 3
    assert "Connect call failed" in one_line(result)


def test_a_streams_command_pointed_at_a_nats_port_says_so(tmp_path: Path, nats_server: NatsServer) -> None:
    result = run(tmp_path, "topic", "list", "--url", f"http://127.0.0.1:{nats_server.port}")
    assert result.returncode == 2
    assert "is a NATS server, not a meshplane streams server" in one_line(result)
    assert "server_id" not in result.stderr


def test_pipeline_demo_to_a_closed_port_is_one_line(tmp_path: Path) -> None:
    result = run(tmp_path, "pipeline", "demo", "--url", "http://127.0.0.1:1")
    assert result.returncode == 3
    assert "cannot reach the streams server at http://127.0.0.1:1" in one_line(result)


def test_pipeline_demo_without_spark_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CliError, match=r"pip install 'meshplane\[spark\]'"):
        pipeline.run_pipeline_command(argparse.Namespace())


def test_ls_of_a_missing_discovery_folder_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    result = run(tmp_path, "ls", "--file-kv", str(missing))
    assert result.returncode == 2
    assert f"the discovery folder {missing} does not exist" in one_line(result)
    assert result.stdout == ""
    assert not missing.exists()


def test_a_mistyped_option_is_reported_by_its_command_with_the_nearest_one(tmp_path: Path) -> None:
    result = run(tmp_path, "topic", "consume", "orders", "--partiton", "0")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: meshplane topic consume")
    assert "unrecognized arguments: --partiton 0 (did you mean --partition?)" in result.stderr


def test_group_consume_of_a_missing_group_says_how_to_make_it_and_topic_makes_it(
    tmp_path: Path, streams: StreamsServerProcess
) -> None:
    url = ("--url", streams.url)
    missing = run(tmp_path, "group", "consume", "nobody", *url, "-c", "1")
    assert missing.returncode == 2
    assert "add --topic TOPIC to create it" in one_line(missing)
    assert run(tmp_path, "topic", "create", "made", "--partitions", "1", *url).returncode == 0
    assert run(tmp_path, "topic", "publish", "made", "note", "hello", *url).returncode == 0
    made = run(tmp_path, "group", "consume", "nobody", "--topic", "made", *url, "-c", "1")
    assert made.returncode == 0, made.stderr
    assert "created consumer group 'nobody' on topic 'made'" in made.stderr
    assert json.loads(made.stdout)["data"] == "hello"


def test_tailing_a_room_that_does_not_exist_says_it_waits_then_gets_the_first_event(
    tmp_path: Path, streams: StreamsServerProcess
) -> None:
    tail = subprocess.Popen(
        [*MESHPLANE, "stream", "tail", "later", "--url", streams.url, "--count", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plane_env(tmp_path),
    )
    assert tail.stderr is not None
    try:
        note = read_until(tail.stderr, r"\S", 60, "tail's note")[-1]
        assert "room 'later' does not exist yet: waiting for its first event" in note
        published = run(tmp_path, "stream", "publish", "later", "msg", '{"text": "hi"}', "--url", streams.url)
        assert published.returncode == 0, published.stderr
        out, _ = tail.communicate(timeout=60)
    finally:
        tail.kill()
    tailed = json.loads(out)
    assert tailed["data"] == {"text": "hi"}
    history = run(tmp_path, "stream", "history", "later", "--url", streams.url, "--json")
    assert tailed == json.loads(history.stdout)["events"][0]  # one shape: `type` is msg in both


def _every_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for child in subcommands(parser).values():
        yield from _every_parser(child)


def test_help_says_each_default_once_and_never_none() -> None:
    for parser in _every_parser(build_parser()):
        text = parser.format_help()
        flat = " ".join(text.split())
        for empty in ("None", "[]", "()", "False"):
            assert f"(default: {empty})" not in flat, parser.prog
        assert not re.search(r"default[^()]*\) \(default:", flat, re.IGNORECASE), parser.prog
