"""A topic on the local log: one streams server (host a, its data on a lossy disk); idempotent
producers p1 and p2 append one event at a time to a one-partition topic with small segments (so
segments roll under the faults), each retrying an unknown outcome with the same idempotency key
until it is answered. At the end the partition is read whole."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import aiohttp

from tests.chaos.checker import Op, Verdict, check_log, unreadable
from tests.chaos.harness import Body, Servers, Workload, run_schedule, streams_server
from tests.chaos.schedule import Fault

HOSTS = ("a",)
TOPIC = "ledger"


class Unanswered(Exception):
    pass


async def append(http: aiohttp.ClientSession, url: str, producer: str, seq: int) -> int:
    """The offset the server gave the event (raises Unanswered when it gave none)."""
    request = {
        "event_type": "entry",
        "data": {"p": producer, "seq": seq},
        "idempotency_key": f"{producer}-{seq}",
    }
    try:
        async with http.post(f"{url}/topics/{TOPIC}/publish", json=request) as response:
            if response.status != 200:
                raise Unanswered(f"{response.status} {await response.text()}")
            return int((await response.json())["offset"])
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Unanswered(str(exc)) from exc


async def produce_until(url: str, producer: str, stop_at: float, history: list[Op]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        seq = 0
        while time.monotonic() < stop_at:
            while True:  # the same key until answered: an idempotent producer's retry
                try:
                    history.append(Op(producer, seq, "ok", await append(http, url, producer, seq)))
                    break
                except Unanswered:
                    if time.monotonic() >= stop_at:
                        history.append(Op(producer, seq, "unknown"))
                        break
                    await asyncio.sleep(0.1)
            seq += 1


async def read_log(
    http: aiohttp.ClientSession, url: str, timeout: float = 90.0
) -> list[tuple[int, str, int]]:
    """The partition whole, once the server answers (a replicated store may still be electing)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await read_once(http, url)
        except (aiohttp.ClientError, TimeoutError, Unanswered):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def read_once(http: aiohttp.ClientSession, url: str) -> list[tuple[int, str, int]]:
    records: list[tuple[int, str, int]] = []
    offset = 0
    while True:
        request = {"from_offset": offset, "limit": 1000}
        async with http.post(f"{url}/topics/{TOPIC}/partitions/0/consume", json=request) as response:
            if response.status != 200:
                raise Unanswered(f"reading {TOPIC}: {response.status} {await response.text()}")
            page: dict[str, Any] = await response.json()
        if not page["events"]:
            return records
        for event in page["events"]:
            data = event["data"]
            fields = data if isinstance(data, dict) else {}
            if not fields and isinstance(data, str):  # not JSON: whatever it is, it is unexpected
                fields = {"p": base64.b64decode(data).decode(errors="replace"), "seq": -1}
            records.append((int(event["offset"]), str(fields.get("p")), int(fields.get("seq", -1))))
        offset = page["next_offset"]


def topic_run(host: str, settings: dict[str, Any]) -> Body:
    """The workload against the streams server on ``host``, its topic created with ``settings``."""

    async def run(
        servers: Servers, faults: list[Fault], duration: float, log: list[str]
    ) -> dict[str, Verdict]:
        url = servers.url(host)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.post(f"{url}/topics/{TOPIC}", json=settings) as response:
                if response.status != 201:
                    raise RuntimeError(f"creating {TOPIC}: {response.status} {await response.text()}")
            history: list[Op] = []
            stop_at = time.monotonic() + duration
            producers = [produce_until(url, producer, stop_at, history) for producer in ("p1", "p2")]
            await asyncio.gather(run_schedule(servers, faults, log), *producers)
            log.append(f"appended {len(history)}, reading the log")
            try:
                records = await read_log(http, url)
            except (aiohttp.ClientError, TimeoutError, Unanswered) as exc:  # unreadable, not lost
                log.append(f"the topic could not be read within 90 s: {exc}")
                return {TOPIC: unreadable(history)}
            return {TOPIC: check_log(history, records)}

    return run


WORKLOAD = Workload(
    HOSTS,
    ("isolate", "cap", "kill", "power", "pause"),
    streams_server(lambda servers, host: ()),
    topic_run("a", {"num_partitions": 1, "segment_bytes": 64 << 10}),
)
