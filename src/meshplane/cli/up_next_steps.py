"""What ``meshplane up`` runs for the demo, and the commands it prints for another shell."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from meshplane.config import PlaneConfig
from meshplane.core.brokers import BrokerAddress
from meshplane.core.names import Scope

DEMO_SCOPE = Scope.endpoint("dynamo", "worker", "generate")
DEMO_TOPIC = "kv-events"


DEMO_STREAM_TOPIC = "demo-events"
DEMO_PARTITIONS = 4
DEMO_WINDOWS_TOPIC = "demo-windows"  # where `pipeline demo` writes its window counts


def print_next_steps(
    config: PlaneConfig,
    shown_url: str | None,
    addresses: tuple[BrokerAddress, ...],
    streams_url: str | None,
    local: tuple[str, bool] | None,
    runs_pipeline: bool,
    mesh_url: str | None = None,
) -> None:
    variables = [
        f"DYN_EVENT_PLANE={config.event_plane}",
        "DYN_DISCOVERY_BACKEND=file",
        f"DYN_FILE_KV={config.file_kv}",
    ]
    if shown_url:
        variables.append(f"NATS_SERVER={shown_url.replace('***@', 'YOUR_TOKEN@')}")
    if addresses:
        variables.append("DYN_ZMQ_BROKER_ENABLED=true")
    if config.event_plane == "mesh":
        variables.append(f"MESHPLANE_NODE={config.mesh_node}")
    exports = " ".join(variables)
    on_path = shutil.which("meshplane") is not None
    command = "meshplane" if on_path else str(Path(sys.executable).with_name("meshplane"))
    if local is not None and local[1]:
        print(f"  from another shell (context {local[0]!r} is selected while this runs):", flush=True)
        prefix = url = ""
    elif local is not None:
        print(
            f"  from another shell (context {local[0]!r}; another run's context is selected, "
            f"so pick this one with MESHPLANE_CONTEXT={local[0]}):",
            flush=True,
        )
        prefix, url = f"MESHPLANE_CONTEXT={local[0]} ", ""
    else:
        print("  from another shell:", flush=True)
        prefix, url = exports + " ", f" --url {streams_url}" if streams_url is not None else ""
    print(f"    {prefix}{command} sub {DEMO_SCOPE} {DEMO_TOPIC}", flush=True)
    print(f"    {prefix}{command} ls", flush=True)
    if mesh_url is not None:
        print(f"    {command} mesh status --url {mesh_url}   (node a: its links and interest)", flush=True)
    if streams_url is not None:
        print(f"    {prefix}{command} topic stats {DEMO_STREAM_TOPIC}{url}", flush=True)
        if runs_pipeline:
            print(
                f"    {prefix}{command} topic consume {DEMO_WINDOWS_TOPIC}{url}   (the pipeline's windows)",
                flush=True,
            )
        else:
            spark = f"pipeline demo --source {DEMO_STREAM_TOPIC}{url}   (Spark)"
            print(f"    {prefix}{command} {spark}", flush=True)
    if local is not None:
        print(f"  as variables (`meshplane env {local[0]}` prints them): {exports}", flush=True)
    if not on_path:
        print("  (meshplane is not on PATH: `make shell` opens a shell where it is)", flush=True)
