"""A consumer group on JetStream under wall-clock jumps (issue 36: the one place wall time decides
is a JetStream group's session deadlines, which every streams server reads from its own clock):
three nats-servers (n1-n3, one JetStream cluster) and two streams servers (s1, s2) keeping the group
there with three replicas; three members on the client host, each speaking to both servers (in
different orders), joining, heartbeating and committing as in :mod:`.groups_workload`. The faults
fall on the streams servers: **clock** steps one server's wall clock 15 s ahead and back again at
heal (its monotonic clock untouched), kill, pause and isolate. Checked as the local group is: no two
owners of a partition in one generation, fencing, commits strictly forward, the final commit kept."""

from __future__ import annotations

import asyncio
import time

from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.chaos.checker import Verdict
from tests.chaos.groups_workload import GROUP, PARTITIONS, TOPIC, Assigned, Commit, check_group, member
from tests.chaos.harness import HTTP_PORT, Server, Servers, Workload, run_schedule
from tests.chaos.jetstream_workload import CLIENT_PORT, NATS, NatsHost
from tests.chaos.schedule import Fault

STREAMS = ("s1", "s2")


def server(servers: Servers, host: str, fsync: str) -> Server:
    if host in NATS:
        return NatsHost(servers, host, fsync == "always")
    storage = ",".join(f"nats://{servers.network.address(n)}:{CLIENT_PORT}" for n in NATS)
    return StreamsServerProcess(
        port=HTTP_PORT,
        data_dir=servers.mount(host) / "data",
        extra_args=("--host", servers.network.address(host), "--storage", storage, "--replicas", "3"),
        env=servers.clock_env(host),
        launcher=servers.network.exec_prefix(host),
    )


async def run(servers: Servers, faults: list[Fault], duration: float, log: list[str]) -> dict[str, Verdict]:
    urls = [servers.url(host) for host in STREAMS]
    async with StreamsClient(",".join(urls), timeout=10.0) as client:
        await client.create_topic(TOPIC, PARTITIONS)
        await client.create_group(GROUP, TOPIC, session_timeout_secs=2.0)
        assigned: list[Assigned] = []
        commits: list[Commit] = []
        stop_at = time.monotonic() + duration
        orders = (urls, urls[::-1], urls)
        members = [
            member(",".join(order), f"m{i}", stop_at, assigned, commits) for i, order in enumerate(orders)
        ]
        await asyncio.gather(run_schedule(servers, faults, log), *members)
        log.append(f"{len(commits)} commits in {len({a.generation for a in assigned})} generations")
        final = {p: await client.committed(GROUP, p) for p in range(PARTITIONS)}
    return {GROUP: check_group(assigned, commits, final)}


WORKLOAD = Workload(
    (*NATS, *STREAMS), ("clock", "kill", "pause", "isolate"), server, run, targets=STREAMS, waves=(NATS,)
)
