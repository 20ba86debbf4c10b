"""Every file in examples/ runs as printed against real servers, and the README shows them as they are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.launchers import NatsServer, StreamsServerProcess

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def streams() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess() as proc:
        yield proc.start()


@pytest.fixture
def env(nats_server: NatsServer, streams: StreamsServerProcess, tmp_path: Path) -> dict[str, str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_", "ETCD_", "MESHPLANE_"))
    }
    return {
        **clean,
        "NATS_SERVER": nats_server.url,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "MESHPLANE_STREAMS_URL": streams.url,
    }


def run_example(name: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("transport", ["nats", "zmq"])
def test_quickstart(env: dict[str, str], transport: str) -> None:
    out = run_example("quickstart.py", {**env, "DYN_EVENT_PLANE": transport})
    assert re.fullmatch(r"\d+ 0 \{'stored': \[1, 2, 3\]\}\n", out)


def test_callbacks(env: dict[str, str]) -> None:
    assert "received EventEnvelope(" in run_example("callbacks.py", env)


def test_synap_client(env: dict[str, str]) -> None:
    assert run_example("synap_client.py", env) == "read back {'text': 'hi'}\n"


def test_streams_client_runs_again_and_again(env: dict[str, str]) -> None:
    first = run_example("streams_client.py", env)
    assert first.startswith("replayed {'text': 'hi'} ; committed")
    assert run_example("streams_client.py", env).startswith("replayed")  # no 409 the second time


def test_the_readme_shows_every_example_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = dict(re.findall(r"<!-- example: examples/(\S+) -->\n```python\n(.*?)```", readme, re.DOTALL))
    files = {p.name: p.read_text() for p in EXAMPLES.glob("*.py")}
    assert shown == files


def test_app(env: dict[str, str]) -> None:
    assert run_example("app.py", env) == "Receipt(order_id=1, total=12.0)\n"
