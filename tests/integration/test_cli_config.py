"""`meshplane serve --config FILE` on a real server: the file's sections reach the service, flags win
over it; a bad file is one line; `config show` prints a file `config check` accepts."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from meshplane.errors import MeshplaneError
from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.support.cli import MESHPLANE, plane_env

CONFIG = """\
port = 1  # the flag --port wins
fsync = "always"

[limits]
max_topics = 2

[mesh]
node_id = "from-file"
route_port = 0

[distributed_state]
bloom_filter_capacity = 5000
"""


def test_serve_takes_its_settings_from_the_file_and_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(CONFIG)
    with StreamsServerProcess(extra_args=("--config", str(config))) as server:
        server.start()
        assert server.port != 1
        assert server.announced["mesh"]["node"] == "from-file"

        async def create_three() -> list[str]:
            failures = []
            async with StreamsClient(server.url) as client:
                for name in ("one", "two", "three"):
                    try:
                        await client.create_topic(name, 1)
                    except MeshplaneError as exc:
                        failures.append(str(exc))
                status = await client.request("GET", "/mesh")
            assert status["node"] == "from-file"
            return failures

        failures = asyncio.run(create_three())
    assert len(failures) == 1
    assert "topics" in failures[0]


def test_a_bad_file_stops_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("[limits]\nmax_topicz = 2\nmax_rooms = 'many'\n")
    result = subprocess.run(
        [*MESHPLANE, "serve", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        env=plane_env(tmp_path),
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"meshplane: error: {config}:2: [limits] max_topicz: unknown key (did you mean max_topics?) "
        f"and 1 more (meshplane config check {config} lists every problem)"
    )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("storage", [None, "nats://user:pw@127.0.0.1:4222"])
def test_config_show_says_where_each_setting_comes_from_and_prints_a_file_check_accepts(
    tmp_path: Path, storage: str | None
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(CONFIG)
    env = plane_env(tmp_path)
    if storage:
        env["MESHPLANE_STREAMS_STORAGE"] = storage
    shown = subprocess.run(
        [*MESHPLANE, "config", "show", str(config), "--port", "17000"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "port = 17000  # flag --port" in lines
    assert f'fsync = "always"  # {config}:2' in lines
    assert f"max_topics = 2  # {config}:5" in lines
    assert "max_rooms = 10000  # default" in lines
    assert "bloom_filter_capacity = 5000" in shown.stdout
    if storage:
        assert '# storage = "nats://***@127.0.0.1:4222"  # $MESHPLANE_STREAMS_STORAGE' in lines
        assert "pw" not in shown.stdout
    again = tmp_path / "shown.toml"
    again.write_text(shown.stdout)
    checked = subprocess.run(
        [*MESHPLANE, "config", "check", str(again)], capture_output=True, text=True, timeout=60, env=env
    )
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.endswith("no problems\n")
