"""What ``meshplane up`` runs for the demo, and the commands it prints for another shell."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from meshplane import context
from meshplane.core.names import Scope
from meshplane.core.urls import redact_url

DEMO_SCOPE = Scope.endpoint("dynamo", "worker", "generate")
DEMO_TOPIC = "kv-events"


DEMO_STREAM_TOPIC = "demo-events"
DEMO_PARTITIONS = 4
DEMO_WINDOWS_TOPIC = "demo-windows"  # where `pipeline demo` writes its window counts


def shown_variables(variables: dict[str, str]) -> str:
    """``NAME=value ...`` for another shell, each token replaced by YOUR_TOKEN (never printed)."""
    shown = []
    for name, value in variables.items():
        if name in context.SECRETS:
            value = "YOUR_TOKEN"
        elif "@" in value:
            value = redact_url(value).replace("***@", "YOUR_TOKEN@")
        shown.append(f"{name}={shlex.quote(value)}")
    return " ".join(shown)


def print_next_steps(variables: dict[str, str], local: tuple[str, bool] | None, runs_pipeline: bool) -> None:
    exports = shown_variables(variables)
    streams_url, mesh_url = variables.get("MESHPLANE_STREAMS_URL"), variables.get("MESHPLANE_MESH_URL")
    on_path = shutil.which("meshplane") is not None
    command = "meshplane" if on_path else str(Path(sys.executable).with_name("meshplane"))
    if local is not None and local[1]:
        print(f"  from another shell (context {local[0]!r} is selected while this runs):", flush=True)
        prefix = ""
    elif local is not None:
        print(
            f"  from another shell (context {local[0]!r}; another run's context is selected, "
            f"so pick this one with MESHPLANE_CONTEXT={local[0]}):",
            flush=True,
        )
        prefix = f"MESHPLANE_CONTEXT={local[0]} "
    else:
        print("  from another shell:", flush=True)
        prefix = exports + " "
    print(f"    {prefix}{command} sub {DEMO_SCOPE} {DEMO_TOPIC}", flush=True)
    print(f"    {prefix}{command} ls", flush=True)
    if mesh_url is not None:
        print(f"    {prefix}{command} mesh status   (node a: its links and interest)", flush=True)
    if streams_url is not None:
        print(f"    {prefix}{command} topic stats {DEMO_STREAM_TOPIC}", flush=True)
        if runs_pipeline:
            print(
                f"    {prefix}{command} topic consume {DEMO_WINDOWS_TOPIC}   (the pipeline's windows)",
                flush=True,
            )
        else:
            spark = f"pipeline demo --source {DEMO_STREAM_TOPIC}   (Spark)"
            print(f"    {prefix}{command} {spark}", flush=True)
    if local is not None:
        print(f"  as variables (`meshplane env {local[0]}` prints them): {exports}", flush=True)
    if not on_path:
        print("  (meshplane is not on PATH: `make shell` opens a shell where it is)", flush=True)
