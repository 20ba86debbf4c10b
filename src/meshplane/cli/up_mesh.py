"""``meshplane up --nodes N``: the demo through an event mesh of N local nodes (each a
``meshplane serve --node-id`` process), publishers spread over the nodes, the subscriber on the last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplane.config import PlaneConfig
from meshplane.errors import ConfigError
from meshplane.launchers import MeshCluster


def start_mesh(nodes: int, state_dir: Path) -> MeshCluster:
    if nodes < 2:
        raise ConfigError("--nodes needs at least 2 (one node is `meshplane serve --node-id`)")
    # the nodes' dashboards list what the demo registers: up's own discovery folder
    discovery = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(state_dir / "kv")}
    cluster = MeshCluster(nodes, cluster="up", heartbeat_interval=1.0, env=discovery)
    for node, node_id in zip(cluster.nodes, cluster.ids, strict=True):
        node.data_dir = state_dir / "mesh" / node_id
    try:
        cluster.start().wait_linked()  # an event published before its node has a link is not delivered
    except BaseException:
        cluster.cleanup()
        raise
    return cluster


def publisher_configs(cluster: MeshCluster, config: PlaneConfig, publishers: int) -> list[PlaneConfig]:
    """One plane per publisher, each on the next node in turn."""
    return [
        config.replace(mesh_node=cluster.nodes[i % len(cluster.nodes)].route_url) for i in range(publishers)
    ]


async def mesh_summary(cluster: MeshCluster, http: Any) -> str:
    """``mesh 3 nodes, 6/6 links up, 1,234 forwarded`` from each node's GET /mesh."""
    up = total = forwarded = 0
    for node in cluster.nodes:
        try:
            async with http.get(f"{node.url}/mesh") as response:
                status = await response.json()
        except Exception:  # a node that does not answer is one whose links are not up
            total += len(cluster.nodes) - 1
            continue
        links = status["links"]
        total += len(cluster.nodes) - 1
        up += sum(1 for link in links if link["state"] == "up")
        forwarded += status["counters"]["messages_forwarded"]
    return f"mesh {len(cluster.nodes)} nodes, {up}/{total} links up, {forwarded} forwarded"
