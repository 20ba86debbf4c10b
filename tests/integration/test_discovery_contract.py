"""One discovery contract for every backend, plus what is specific to file and etcd, on a real etcd."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from meshplane import DiscoveryError, Scope
from meshplane.core.records import EventChannel, key_to_file_name
from meshplane.core.snapshots import Added, DiscoveryEvent, Removed
from meshplane.discovery.base import Discovery
from meshplane.discovery.channels import ChannelAdded, ChannelWatch
from meshplane.discovery.etcd import EtcdDiscovery
from meshplane.discovery.file import FileDiscovery
from meshplane.discovery.mem import MemoryDiscovery
from meshplane.launchers import EtcdServer
from tests.helpers import eventually, read_until

REPO = Path(__file__).resolve().parents[2]
DiscoveryFactory = Callable[[], Awaitable[Discovery]]


class Recorder:
    """Collects what ``list_and_watch`` yields, in a background task."""

    def __init__(self, discovery: Discovery, prefix: str) -> None:
        self.events: list[DiscoveryEvent] = []
        self._task = asyncio.create_task(self._run(discovery, prefix))

    async def _run(self, discovery: Discovery, prefix: str) -> None:
        async for event in discovery.list_and_watch(prefix):
            self.events.append(event)

    def saw(self, event: DiscoveryEvent) -> bool:
        return event in self.events

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@pytest.fixture(params=["mem", "file", "etcd"])
async def make_discovery(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[DiscoveryFactory]:
    """A factory of started discovery objects sharing one backend (as separate processes would)."""
    made: list[Discovery] = []

    def build() -> Discovery:
        if request.param == "mem":
            return MemoryDiscovery()
        if request.param == "file":
            return FileDiscovery(tmp_path / "kv", ttl=5.0, poll_interval=0.02)
        etcd: EtcdServer = request.getfixturevalue("etcd_server")
        return EtcdDiscovery((etcd.endpoint,), lease_ttl=5)

    async def factory() -> Discovery:
        discovery = build()
        await discovery.start()
        made.append(discovery)
        return discovery

    yield factory
    for discovery in made:
        await discovery.close()


@pytest.fixture
def prefix() -> str:
    return f"v1/event_channels/namespace/d{uuid.uuid4().hex[:8]}/"


async def test_register_list_watch_unregister(make_discovery: DiscoveryFactory, prefix: str) -> None:
    owner, watcher = await make_discovery(), await make_discovery()
    await owner.register(prefix + "topic/t/1", b"one")
    assert await watcher.list(prefix) == {prefix + "topic/t/1": b"one"}
    recorder = Recorder(watcher, prefix)
    await eventually(lambda: recorder.saw(Added(prefix + "topic/t/1", b"one")), what="initial Added")
    await owner.register(prefix + "topic/t/2", b"two")
    await eventually(lambda: recorder.saw(Added(prefix + "topic/t/2", b"two")), what="Added for a new key")
    await owner.register(prefix + "topic/t/2", b"two-v2")
    await eventually(lambda: recorder.saw(Added(prefix + "topic/t/2", b"two-v2")), what="Added for a change")
    await owner.unregister(prefix + "topic/t/1")
    await eventually(lambda: recorder.saw(Removed(prefix + "topic/t/1")), what="Removed")
    assert await watcher.list(prefix) == {prefix + "topic/t/2": b"two-v2"}
    assert await watcher.list(prefix + "other/") == {}
    await recorder.stop()


async def test_close_removes_every_key_of_the_owner(make_discovery: DiscoveryFactory, prefix: str) -> None:
    owner, watcher = await make_discovery(), await make_discovery()
    for i in range(3):
        await owner.register(f"{prefix}topic/t/{i}", b"x")
    assert owner.registered == 3
    recorder = Recorder(watcher, prefix)
    await eventually(lambda: len(recorder.events) == 3, what="3 initial Added")
    await owner.close()
    await eventually(lambda: sum(isinstance(e, Removed) for e in recorder.events) == 3, what="3 Removed")
    assert await watcher.list(prefix) == {}
    await recorder.stop()


async def test_garbage_records_are_counted_and_skipped(make_discovery: DiscoveryFactory, prefix: str) -> None:
    owner, watcher = await make_discovery(), await make_discovery()
    scope = Scope.parse(prefix.split("/")[3])
    good = EventChannel(scope, "t", 42, "Zmq", {"endpoint": "tcp://127.0.0.1:1"})
    await owner.register(scope.channel_key("t", 1), b"{not json")
    await owner.register(scope.channel_key("t", 2), good.to_json())  # filed under the wrong id
    await owner.register(scope.channel_key("t", 3), b"[" * 60_000)  # crashed the watch in a loop
    await owner.register(good.key, good.to_json())
    watch = ChannelWatch(watcher, scope.channel_prefix("t"))
    seen: list[EventChannel] = []

    async def follow() -> None:
        async for event in watch.events():
            if isinstance(event, ChannelAdded):
                seen.append(event.channel)

    task = asyncio.create_task(follow())
    await eventually(lambda: seen == [good] and watch.invalid == 3, what="1 good record, 3 invalid ones")
    task.cancel()


# ---- file backend ----------------------------------------------------------------------------------


async def test_file_layout_is_dynamos_and_writes_are_atomic(tmp_path: Path) -> None:
    discovery = FileDiscovery(tmp_path, ttl=5)
    await discovery.start()
    channel = EventChannel(
        Scope.endpoint("probe", "worker", "generate"),
        "forward-pass-metrics",
        0x1F,
        "Zmq",
        {"endpoint": "tcp://127.0.0.1:36111"},
    )
    await discovery.register(channel.key, channel.to_json())
    bucket, name = key_to_file_name(channel.key)
    path = (
        tmp_path
        / "v1"
        / "event_channels"
        / (
            "namespace%2Fprobe%2Fcomponent%2Fworker%2Fendpoint%2Fgenerate%2Ftopic%2Fforward%2Dpass%2Dmetrics%2F1f"
        )
    )
    assert (tmp_path / bucket / name) == path
    assert path.read_bytes() == channel.to_json()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file left behind
    await discovery.close()
    assert not path.exists()


async def test_file_records_of_a_stopped_owner_expire(tmp_path: Path) -> None:
    ttl = 1.0
    owner = FileDiscovery(tmp_path, ttl=ttl, poll_interval=0.02)
    watcher = FileDiscovery(tmp_path, ttl=ttl, poll_interval=0.02)
    key = "v1/event_channels/namespace/ns/topic/t/1"
    await owner.register(key, b"v")
    recorder = Recorder(watcher, "v1/event_channels/")
    await eventually(lambda: recorder.saw(Added(key, b"v")))
    # the owner keeps touching (every TTL / 3): still there after three TTLs and six touches
    path = tmp_path / "v1" / "event_channels" / key_to_file_name(key)[1]
    touches: set[int] = set()
    started = time.monotonic()

    def kept_for_three_ttls() -> bool:
        touches.add(path.stat().st_mtime_ns)
        return time.monotonic() - started > 3 * ttl and len(touches) >= 6

    await eventually(kept_for_three_ttls, timeout=30, what="six keep-alive touches over three TTLs")
    assert not recorder.saw(Removed(key))
    # the owner stops touching (as a killed process would): the record expires and is deleted
    assert owner._keepalive is not None
    owner._keepalive.cancel()
    await eventually(lambda: recorder.saw(Removed(key)), timeout=5, what="expiry")
    assert list((tmp_path / "v1" / "event_channels").iterdir()) == []
    await recorder.stop()


async def test_file_owner_rewrites_a_record_deleted_under_it(tmp_path: Path) -> None:
    owner = FileDiscovery(tmp_path, ttl=0.3)
    key = "v1/event_channels/namespace/ns/topic/t/1"
    await owner.register(key, b"v")
    path = tmp_path / "v1" / "event_channels" / key_to_file_name(key)[1]
    path.unlink()
    await eventually(path.exists, timeout=5, what="record rewritten")
    assert path.read_bytes() == b"v"
    await owner.close()


async def test_file_backend_ignores_foreign_and_half_written_files(tmp_path: Path) -> None:
    folder = tmp_path / "v1" / "event_channels"
    folder.mkdir(parents=True)
    (folder / "not-an-escaped-key").write_bytes(b"x")
    (folder / ".namespace%2Fns.123.tmp").write_bytes(b"{half")
    (folder / "namespace%2Fns%2Ftopic%2Ft%2F1").write_bytes(b"ok")
    discovery = FileDiscovery(tmp_path, ttl=5)
    assert await discovery.list("v1/event_channels/") == {"v1/event_channels/namespace/ns/topic/t/1": b"ok"}


def _spawn_registrar(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.registrar", *args], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert read_until(proc.stdout, r"\S", 60, "the registrar")[-1].strip() == "registered"
    return proc


@pytest.mark.parametrize("backend", ["file", "etcd"])
async def test_records_of_a_killed_process_disappear(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    key = f"v1/event_channels/namespace/k{uuid.uuid4().hex[:8]}/topic/t/1"
    watcher: Discovery
    if backend == "file":
        where, watcher = str(tmp_path), FileDiscovery(tmp_path, ttl=1.0, poll_interval=0.05)
    else:
        etcd: EtcdServer = request.getfixturevalue("etcd_server")
        where, watcher = etcd.endpoint, EtcdDiscovery((etcd.endpoint,))
    await watcher.start()
    ttl = 1 if backend == "file" else 2
    proc = _spawn_registrar(backend, where, str(ttl), key, "alive")
    recorder = Recorder(watcher, key)
    await eventually(lambda: recorder.saw(Added(key, b"alive")), what="record of the live process")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = time.monotonic()
    await eventually(
        lambda: recorder.saw(Removed(key)), timeout=10, what="record of the killed process removed"
    )
    assert time.monotonic() - killed_at < 3 * ttl + 1  # a record lives a TTL past its last renewal
    await recorder.stop()
    await watcher.close()


# ---- etcd backend ----------------------------------------------------------------------------------


@pytest.fixture
def private_etcd() -> Iterator[EtcdServer]:
    """An etcd of the test's own, to kill and restart."""
    with EtcdServer() as server:
        server.start()
        yield server


@pytest.mark.parametrize("wipe", [False, True], ids=["same-data", "data-lost"])
async def test_etcd_restart_reregisters_and_resumes_watches(private_etcd: EtcdServer, wipe: bool) -> None:
    owner = EtcdDiscovery((private_etcd.endpoint,), lease_ttl=2, connect_timeout=2)
    watcher = EtcdDiscovery((private_etcd.endpoint,), lease_ttl=2, connect_timeout=2)
    await owner.start()
    await watcher.start()
    await owner.register("v1/event_channels/namespace/r/topic/t/1", b"before")
    recorder = Recorder(watcher, "v1/event_channels/")
    await eventually(lambda: len(recorder.events) == 1)

    private_etcd.kill(signal.SIGKILL)
    await asyncio.to_thread(private_etcd.start, 20.0, wipe)

    # the owner's keep-alive notices (lease gone or connection lost) and registers again
    async def key_is_back() -> bool:
        return bool(await watcher.list("v1/event_channels/namespace/r/"))

    await eventually(key_is_back, timeout=20, what="key back in etcd")
    # the watch resumes: a key written after the restart is reported
    late = EtcdDiscovery((private_etcd.endpoint,), lease_ttl=2)
    await late.register("v1/event_channels/namespace/r/topic/t/2", b"after")
    await eventually(
        lambda: recorder.saw(Added("v1/event_channels/namespace/r/topic/t/2", b"after")),
        timeout=20,
        what="watch resumed after the restart",
    )
    for d in (late, owner, watcher):
        await d.close()
    await recorder.stop()


async def test_unreachable_etcd_is_a_clear_error() -> None:
    from meshplane.launchers import free_port

    discovery = EtcdDiscovery((f"127.0.0.1:{free_port()}",), connect_timeout=1)
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match="cannot reach etcd"):
        await discovery.start()
    assert time.monotonic() - started < 10
