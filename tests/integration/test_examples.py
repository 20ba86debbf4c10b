"""Every file in examples/ runs as printed against real servers, and the README shows them as they are."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.launchers import NatsServer, StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.helpers import wait_until
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
