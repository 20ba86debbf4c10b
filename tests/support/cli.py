"""The meshplane command as a user runs it, in an environment cleaned of the developer's settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from meshplane.launchers import StreamsServerProcess

MESHPLANE = [sys.executable, "-m", "meshplane.cli.main"]
PLANE_PREFIXES = ("DYN_", "NATS_", "ETCD_", "MESHPLANE_")


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``meshplane ARGS...`` to its end, its output captured as text (``env``: the whole environment)."""
    return subprocess.run(
        [*MESHPLANE, *args], env=env, input=input, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def clean_env(prefixes: tuple[str, ...] = PLANE_PREFIXES) -> dict[str, str]:
    """This process's environment without the variables that would point a command elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def plane_env(tmp_path: Path, transport: str = "zmq") -> dict[str, str]:
    """An event plane on ``transport`` with file discovery under ``tmp_path``."""
    return {
        **clean_env(),
        "DYN_EVENT_PLANE": transport,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
    }


def streams_env(server: StreamsServerProcess) -> dict[str, str]:
    """Client commands pointed at ``server``."""
    return {**clean_env(("MESHPLANE_",)), "MESHPLANE_STREAMS_URL": server.url}
