"""What one ``meshplane up`` holds while it runs: its state folder (a lock, and ``up.json`` naming
the run for the next one's refusal and for ``meshplane status``) and its connection context."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from meshplane import context
from meshplane.cli.up_pipeline import PipelineSupervisor
from meshplane.config import PlaneConfig
from meshplane.errors import ConfigError, MeshplaneError
from meshplane.launchers import MeshCluster
from meshplane.streams.lock import DataDirLock

RUNNING_FILE = "up.json"  # the running `up`: its pid, dashboard, pipeline and mesh nodes


class RunState:
    """What ``up.json`` says about this run, rewritten (atomically) at each status line."""

    def __init__(self, state_dir: Path, dashboard: str | None, mesh: MeshCluster | None) -> None:
        self.state_dir = state_dir
        self.dashboard = dashboard
        self.mesh = mesh
        self.pipeline: PipelineSupervisor | None = None

    def as_json(self) -> dict[str, Any]:
        nodes = zip(self.mesh.ids, self.mesh.nodes, strict=True) if self.mesh is not None else ()
        return {
            "pid": os.getpid(),
            "dashboard": self.dashboard,
            "pipeline": dataclasses.asdict(self.pipeline.health) if self.pipeline is not None else None,
            "mesh_nodes": [{"id": node_id, "url": node.url, "pid": node.pid} for node_id, node in nodes],
        }

    def write(self) -> None:
        path = self.state_dir / RUNNING_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.as_json()) + "\n")
        os.replace(temporary, path)


def read_running(state_dir: Path) -> dict[str, Any]:
    """The running `up`'s ``up.json``, or {} when there is none or it is unreadable."""
    try:
        found = json.loads((state_dir / RUNNING_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def lock_state_dir(state_dir: Path) -> DataDirLock:
    """One `up` per state folder: a second would write the same streams data directory and kv folder."""
    lock = DataDirLock(state_dir)
    if lock.try_acquire():
        return lock
    running = read_running(state_dir)
    dashboard = f", dashboard {running['dashboard']}" if running.get("dashboard") else ""
    raise ConfigError(
        f"another `meshplane up` runs in {state_dir} (pid {running.get('pid') or lock.holder()}{dashboard}): "
        "stop it, or give this one a folder of its own with --state-dir DIR"
    )


def context_values(
    args: argparse.Namespace,
    config: PlaneConfig,
    nats_url: str | None,
    streams_url: str | None,
    mesh_url: str | None,
) -> dict[str, str]:
    """Every variable another shell needs to reach this run: its context, and the line `up` prints."""
    values = {
        "MESHPLANE_STATE_DIR": str(args.state_dir.resolve()),
        "DYN_EVENT_PLANE": config.event_plane,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(config.file_kv),
    }
    if nats_url:
        values["NATS_SERVER"] = nats_url
    if config.event_plane == "mesh":
        values["MESHPLANE_NODE"] = config.mesh_node
    if mesh_url is not None:
        values["MESHPLANE_MESH_URL"] = mesh_url
    if config.zmq_brokers:
        values["DYN_ZMQ_BROKER_ENABLED"] = "true"
    if streams_url is not None:
        values["MESHPLANE_STREAMS_URL"] = streams_url
        if args.token:
            values["MESHPLANE_STREAMS_TOKEN"] = args.token
    return values


def save_context(args: argparse.Namespace, values: dict[str, str]) -> tuple[str, bool] | None:
    """Save this run's context and select it unless another live `up` holds the selection (other shells'
    commands then need no variables). Returns its name and whether it is selected."""
    if args.context == "none":
        return None
    description = f"meshplane up (pid {os.getpid()})"
    return context.claim_for_run(args.context, values, description)


def drop_context(name: str) -> None:
    with contextlib.suppress(OSError, MeshplaneError):
        context.release_run(name)
