"""Every file in examples/ runs as printed against real servers, and the README shows them as they are."""

from __future__ import annotations

import asyncio
import http.server
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.helpers import read_until, wait_until
from tests.support.cli import MESHPLANE

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
def test_quickstart_prints_its_own_event_even_beside_the_demo(
    env: dict[str, str], transport: str, tmp_path: Path
) -> None:
    """Issue 35: beside `make run`'s demo (kv-events in the same scope) it printed the demo's events."""
    demo = subprocess.Popen(
        [
            *MESHPLANE,
            "pub",
            "dynamo/worker/generate",
            "kv-events",
            "demo",
            "--count",
            "100000",
            "--rate",
            "200",
        ],
        env={**env, "DYN_EVENT_PLANE": transport},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: any((tmp_path / "kv").rglob("*")), timeout=30, what="the demo registered")
        out = run_example("quickstart.py", {**env, "DYN_EVENT_PLANE": transport})
    finally:
        demo.kill()
        demo.wait()
    assert re.fullmatch(r"publisher [0-9a-f]+ event 0: \{'stored': \[1, 2, 3\]\}\n", out)


def test_callbacks(env: dict[str, str]) -> None:
    assert run_example("callbacks.py", env) == "received hello\n"


def _requirements(distribution: str, extras: set[str], seen: set[str]) -> None:
    """Every distribution ``pip install distribution[extras]`` brings in, into ``seen``."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen.add(canonicalize_name(distribution))
    try:
        listed = requires(distribution) or []
    except PackageNotFoundError:
        return
    for line in listed:
        requirement = Requirement(line)
        wanted = requirement.marker is None or any(
            requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""})
        )
        name = canonicalize_name(requirement.name)
        if wanted and (name not in seen or requirement.extras):
            if name == "meshplane":  # meshplane[streams] inside an extra: its extras' requirements
                for extra in requirement.extras - extras:
                    extras.add(extra)
                    _requirements("meshplane", extras, seen)
            else:
                _requirements(requirement.name, set(requirement.extras), seen)


def test_every_example_runs_on_what_make_run_installs() -> None:
    """Issue 35: synap_client.py failed after `make run` (synap-sdk was only in the dev extra)."""
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    makefile = (ROOT / "Makefile").read_text()
    installs = re.search(r"RUN_STAMP\):.*?-e '\.\[([a-z,-]+)\]'", makefile, re.DOTALL)
    assert installs is not None, "the Makefile's run install line moved"
    extras = set(installs[1].split(","))
    installed: set[str] = set()
    _requirements("meshplane", set(extras), installed)
    providers = packages_distributions()
    for example in EXAMPLES.glob("*.py"):
        modules = re.findall(r"^(?:from|import) ([a-z_]+)", example.read_text(), re.MULTILINE)
        for module in set(modules) - set(sys.stdlib_module_names) - {"meshplane"}:
            names = {canonicalize_name(d) for d in providers.get(module, [])}
            assert names & installed, f"{example.name} imports {module}, which `make run` does not install"


def test_synap_client(env: dict[str, str]) -> None:
    assert run_example("synap_client.py", env) == "read back {'text': 'hi'}\n"


def test_streams_client_commits_exactly_what_it_handled_run_after_run(
    env: dict[str, str], streams: StreamsServerProcess
) -> None:
    """Issue 35: the example committed its own publish's offset without reading anything."""
    first = run_example("streams_client.py", env)
    assert first == "replayed {'text': 'hi'} ; handled and committed 1 orders\n"
    # The first run's last publish (after its member left) and the second run's own: both handled once.
    assert (
        run_example("streams_client.py", env) == "replayed {'text': 'hi'} ; handled and committed 2 orders\n"
    )

    async def positions() -> tuple[dict[int, int], dict[int, int | None]]:
        async with StreamsClient(streams.url) as client:
            stats = await client.topic_stats("orders")
            ends = {int(p["partition_id"]): int(p["next_offset"]) for p in stats["partitions"]}
            committed = {p: await client.committed("processors", p) for p in ends}
        return ends, committed

    ends, committed = asyncio.run(positions())
    # Everything written is committed but the last run's channel publish, which nobody has handled yet.
    assert sum(ends.values()) - sum(c or 0 for c in committed.values()) == 1


def test_app(env: dict[str, str]) -> None:
    assert run_example("app.py", env) == "Receipt(order_id=1, total=12.0)\n"


def _expected(name: str) -> str:
    """What each example prints (a regex): one for every file in examples/."""
    return {
        "quickstart.py": r"publisher [0-9a-f]+ event 0: \{'stored': \[1, 2, 3\]\}\n",
        "callbacks.py": r"received hello\n",
        "app.py": r"Receipt\(order_id=1, total=12\.0\)\n",
        "synap_client.py": r"read back \{'text': 'hi'\}\n",
        "streams_client.py": r"replayed \{'text': 'hi'\} ; handled and committed \d+ orders\n",
    }[name]


@pytest.mark.timeout(290)  # its waits add up to 270 s
def test_every_example_follows_up_to_a_moved_port_with_a_token(tmp_path: Path) -> None:
    """Issue 57: with port 15500 taken `up` moved the streams server and the CLI followed its context,
    but streams_client.py got a 404 from whatever held 15500, synap_client.py could not parse it, and
    under MESHPLANE_TOKEN streams_client.py got 401; the variables `up` printed left out the streams URL."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_", "ETCD_", "MESHPLANE_"))
    }
    token = "example-t0ken-0123456789"
    # Another web server holds the port `up` asks for: it answers 404 in plain text, as in the issue.
    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    port = squatter.server_address[1]
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        argv = ["up", "--no-pipeline", "--state-dir", str(tmp_path / "up"), "--nats-port", "0"]
        argv += ["--streams-port", str(port), "--publishers", "1", "--rate", "20"]
        up = subprocess.Popen(
            [*MESHPLANE, *argv],
            env={**clean, "MESHPLANE_TOKEN": token},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            printed = "".join(read_until(up.stdout, "as variables", 90, "up's next steps"))
            assert f"port {port} is taken" in printed
            line = printed.splitlines()[-1].split(": ", 1)[1]
            variables = dict(item.split("=", 1) for item in shlex.split(line))
            assert "MESHPLANE_STREAMS_URL" in variables, line
            assert token not in printed  # the token is never printed
            # Another shell, with nothing set: the selected context. Then the printed variables alone.
            shells = {
                "the context": clean,
                "the variables": {
                    **clean,
                    "MESHPLANE_CONTEXT": "none",
                    **{k: v.replace("YOUR_TOKEN", token) for k, v in variables.items()},
                },
            }
            for shell, env in shells.items():
                for example in sorted(EXAMPLES.glob("*.py")):
                    result = subprocess.run(
                        [sys.executable, str(example)], capture_output=True, text=True, timeout=120, env=env
                    )
                    assert result.returncode == 0, f"{example.name} with {shell}: {result.stderr}"
                    assert re.fullmatch(_expected(example.name), result.stdout), (shell, result.stdout)
        finally:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=60)
    finally:
        squatter.shutdown()
        squatter.server_close()
