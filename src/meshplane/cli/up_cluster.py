"""``meshplane up --cluster N``: the demo on an N-node nats-server cluster with JetStream, the event
plane connected to every node, and the streams' topics and groups replicated on it (R3), served by
`up`'s own streams server and a second one (``meshplane serve --storage nats://...``)."""

from __future__ import annotations

from pathlib import Path

from meshplane.cli.serve import STORAGE_ENV
from meshplane.cli.streams import TOKEN_ENV
from meshplane.launchers import JetStreamCluster, StreamsServerProcess

REPLICAS = 3  # each partition and the group bucket on three nodes: any one can die
#: JetStream fsyncs before it acknowledges: with nats-server's default (every two minutes) a power
#: failure of the replicas loses what they acknowledged since (Jepsen, NATS 2.12.1).
SYNC_INTERVAL = "always"


def start_cluster(nodes: int, token: str | None) -> JetStreamCluster:
    cluster = JetStreamCluster(nodes, name="meshplane-up", token=token, sync_interval=SYNC_INTERVAL)
    try:
        cluster.start()
    except BaseException:
        cluster.cleanup()
        raise
    return cluster


def start_second_server(
    cluster: JetStreamCluster, state_dir: Path, token: str | None
) -> StreamsServerProcess:
    """Another streams server on the same JetStream: its storage URLs (which carry the token) and its
    token go through the environment, never on argv."""
    env = {STORAGE_ENV: ",".join(cluster.urls)}
    if token:
        env[TOKEN_ENV] = token
    server = StreamsServerProcess(
        data_dir=state_dir / "streams-2", extra_args=("--replicas", str(REPLICAS)), env=env
    )
    try:
        server.start()
    except BaseException:
        server.cleanup()
        raise
    return server
