"""Broker mode and multi-broker high availability, with real broker processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane import EventPlane, PlaneConfig, Scope
from meshplane.broker import query_stats
from meshplane.launchers import BrokerProcess, EtcdServer
from tests.conftest import make_config, running_brokers
from tests.helpers import eventually, read_until
from tests.support.cli import MESHPLANE, run_cli
from tests.support.processes import stopped

REPO = Path(__file__).resolve().parents[2]
HA_SCOPE = Scope.endpoint("ha", "worker", "generate")


@pytest.fixture
def two_brokers() -> Iterator[list[BrokerProcess]]:
    with running_brokers(("--no-register", "--relay", "python"), ("--no-register",)) as brokers:
        yield brokers  # one of each relay


def broker_url(brokers: list[BrokerProcess]) -> str:
    return f"xsub={';'.join(b.xsub for b in brokers)} , xpub={';'.join(b.xpub for b in brokers)}"


@pytest.mark.timeout(560)  # its waits: four lines of the workers, five conditions, the marker
@pytest.mark.parametrize("kill_one", [False, True], ids=["both-brokers-up", "one-broker-killed-midway"])
async def test_2000_publishers_through_two_brokers_arrive_exactly_once(
    two_brokers: list[BrokerProcess], tmp_path: Path, kill_one: bool
) -> None:
    """The seed's validation: 2,000 publishers x 10 events through 2 brokers = exactly 20,000 events."""
    processes, per_process, per_phase = 4, 500, 5
    env = {
        **os.environ,
        "DYN_EVENT_PLANE": "zmq",
        "DYN_ZMQ_BROKER_URL": broker_url(two_brokers),
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
    }
    config = make_config(
        "zmq", "file", tmp_path, None, None, zmq_brokers=tuple(b.address for b in two_brokers)
    )
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(HA_SCOPE, "kv-events")
        seen: set[tuple[int, int]] = set()
        delivered = 0

        async def consume() -> None:
            nonlocal delivered
            async for envelope in sub:
                delivered += 1
                seen.add((envelope.publisher_id, envelope.sequence))

        consumer = asyncio.create_task(consume())
        workers = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.broker_publishers",
                str(per_process),
                str(per_phase),
                "1.0" if kill_one else "0",  # a second phase of ~5 s: the kill lands in it, loaded or not
                cwd=REPO,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(processes)
        ]

        async def expect(line: bytes) -> None:
            for worker in workers:
                assert worker.stdout is not None
                assert (await asyncio.wait_for(worker.stdout.readline(), 120)).strip() == line

        async def go() -> None:
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write(b"go\n")
                await worker.stdin.drain()

        try:
            await expect(b"ready")
            await go()
            await expect(b"sent")
            half = processes * per_process * per_phase
            await eventually(lambda: len(seen) == half, timeout=60, what=f"{half} events of the first half")
            # the second broker's copy of each: dropped by the subscriber, never delivered
            await eventually(lambda: sub.stats.duplicates_dropped == half, timeout=60, what="every copy")
            total = processes * per_process * per_phase * 2
            await go()
            if kill_one:  # with the second half under way: events in flight through both brokers
                round_size = processes * per_process
                # a round through both brokers: what comes first through one may have a copy in flight
                # through the other, so wait for those copies too (CI killed before any had come)
                await eventually(
                    lambda: (
                        len(seen) >= half + round_size and sub.stats.duplicates_dropped >= half + round_size
                    ),
                    timeout=60,
                    what="a round through both brokers",
                )
                assert len(seen) < total, "the second half was over before the kill"
                two_brokers[1].kill(signal.SIGKILL)
            await expect(b"sent")
            await eventually(lambda: len(seen) == total, timeout=60, what=f"all {total} events")
            if not kill_one:  # every copy through the second broker came, and was dropped
                await eventually(lambda: sub.stats.duplicates_dropped == total, timeout=60, what="every copy")
            # A late copy (from the killed broker) would be dropped, not delivered: the barrier is an
            # event sent after all the others, through the brokers alive.
            marker = await plane.publisher(HA_SCOPE, "kv-events")
            await marker.wait_for_subscribers(1, timeout=20)
            await marker.publish("end")
            await eventually(lambda: (marker.publisher_id, 0) in seen, timeout=60, what="the marker")
            assert delivered == len(seen) == 20_001
            stats = sub.stats
            assert stats.received == 20_001
            assert stats.gaps == 0
            if kill_one:  # copies through the second broker while it lived: part of the second half
                assert half < stats.duplicates_dropped < total
        finally:
            for worker in workers:
                if worker.stdin is not None:
                    worker.stdin.write(b"exit\n")
                    worker.stdin.close()
            for worker in workers:
                await asyncio.wait_for(worker.wait(), 30)
            consumer.cancel()


async def test_fanout_sends_each_publisher_through_its_rendezvous_brokers(
    two_brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    config = make_config(
        "zmq",
        "file",
        tmp_path,
        None,
        None,
        zmq_brokers=tuple(b.address for b in two_brokers),
        broker_fanout=1,
    )
    scope = Scope.namespace(f"fan{uuid.uuid4().hex[:6]}")
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(scope, "t")
        pubs = [await plane.publisher(scope, "t") for _ in range(20)]
        for pub in pubs:
            await pub.wait_for_subscribers(1, timeout=10)
            await pub.publish(b"x")
        events = [await sub.next(10) for _ in range(20)]
        assert {e.publisher_id for e in events} == {p.publisher_id for p in pubs}
        # Nothing else: a marker of each publisher, sent after, comes next, and no copy was dropped.
        for pub in pubs:
            await pub.publish(b"end")
        markers = [await sub.next(10) for _ in range(20)]
        assert [e.payload for e in markers] == [b"end"] * 20
        assert {e.publisher_id for e in markers} == {p.publisher_id for p in pubs}
        assert sub.stats.duplicates_dropped == 0  # one broker each: no copies to drop
    stats = [query_stats(b.stats_endpoint) for b in two_brokers]
    # The C relay counts frames: a Dynamo-layout event is 4 of them.
    per_broker = [s["messages_in"] if s["relay"] == "python" else s["frames_in"] // 4 for s in stats]
    assert sum(per_broker) == 60  # each publisher's event, marker and goodbye (a final heartbeat)
    assert all(n > 0 for n in per_broker), per_broker  # rendezvous hashing spreads the publishers


async def test_a_killed_broker_that_comes_back_is_used_again(tmp_path: Path) -> None:
    broker = BrokerProcess().start()
    try:
        config = make_config("zmq", "file", tmp_path, None, None, zmq_brokers=(broker.address,))
        scope = Scope.namespace(f"rb{uuid.uuid4().hex[:6]}")
        async with EventPlane(config) as plane:
            sub = await plane.subscriber(scope, "t")
            pub = await plane.publisher(scope, "t")
            await pub.wait_for_subscribers(1, timeout=10)
            await pub.publish("before")
            assert (await sub.next(10)).decode() == "before"
            broker.kill(signal.SIGKILL)
            await eventually(
                lambda: pub.subscriber_count == 0, timeout=10, what="publisher sees the broker go"
            )
            await asyncio.to_thread(broker.start)  # same addresses
            await pub.wait_for_subscribers(1, timeout=20)  # both sides reconnected on their own
            await pub.publish("after")
            envelope = await sub.next(10)
            assert (envelope.decode(), envelope.sequence) == ("after", 1)
    finally:
        broker.cleanup()


@pytest.mark.parametrize("slow_broker", ["resumes", "dies"])
async def test_events_that_overtake_on_a_faster_broker_are_delivered_in_order(
    tmp_path: Path, slow_broker: str
) -> None:
    """Events 1..49 go through broker A only, and A stalls; 50..99 go through both and B delivers first.

    The subscriber holds 50..99 for up to the reorder window: if A resumes, all arrive in order; if A
    dies, 50..99 are released in order once the window passes and 1..49 are reported missing.
    """
    from meshplane.core.sequence import EventGap
    from meshplane.launchers import free_port

    slow = BrokerProcess().start()
    fast = BrokerProcess(
        xsub=f"tcp://127.0.0.1:{free_port()}", xpub=f"tcp://127.0.0.1:{free_port()}"
    )  # named in the config, started later
    window = 30.0 if slow_broker == "resumes" else 1.0
    config = make_config(
        "zmq", "file", tmp_path, None, None, zmq_brokers=(slow.address, fast.address), reorder_window=window
    )
    scope = Scope.namespace(f"ro{uuid.uuid4().hex[:6]}")
    try:
        async with EventPlane(config) as plane:
            sub = await plane.subscriber(scope, "t")
            pub = await plane.publisher(scope, "t")
            await pub.wait_for_subscribers(1, timeout=10)  # through the slow broker only
            await pub.publish(0)
            assert (await sub.next(10)).sequence == 0
            slow.kill(signal.SIGSTOP)
            await eventually(lambda: stopped(slow.pid), what="the slow broker stopped")
            for i in range(1, 50):
                await pub.publish(i)  # queued towards the stalled broker
            await asyncio.to_thread(fast.start)
            await pub.wait_for_subscribers(2, timeout=20)
            for i in range(50, 100):
                await pub.publish(i)

            async def held_back() -> bool:
                with pytest.raises(TimeoutError):  # nothing may overtake events 1..49
                    await sub.next(timeout=0.1)
                return sub.stats.reordered == 50

            if slow_broker == "resumes":
                await eventually(held_back, what="events 50..99 held behind 1..49")
                slow.kill(signal.SIGCONT)
                events = [await sub.next(10) for _ in range(99)]
                assert [e.sequence for e in events] == list(range(1, 100))
                assert [e.decode() for e in events] == list(range(1, 100))
                assert (sub.stats.gaps, sub.stats.missing) == (0, 0)
            else:
                slow.kill(signal.SIGKILL)
                events = [await sub.next(10) for _ in range(50)]
                assert [e.sequence for e in events] == list(range(50, 100))
                assert sub.stats.reordered == 50
                assert (sub.stats.gaps, sub.stats.missing) == (1, 49)
                assert EventGap(pub.publisher_id, 1, 49) in sub.recent_notices
            assert sub.stats.received == 1 + len(events)
    finally:
        slow.kill(signal.SIGCONT)
        slow.cleanup()
        fast.cleanup()


async def test_brokers_are_found_in_discovery_even_when_they_start_later(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    prefix_env = {**os.environ, "DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": etcd_server.endpoint}
    late = BrokerProcess(extra_args=(), env=prefix_env)
    config = make_config("zmq", "etcd", tmp_path, None, etcd_server, zmq_broker_enabled=True)
    scope = Scope.namespace(f"dis{uuid.uuid4().hex[:6]}")
    try:
        async with EventPlane(config) as plane:
            sub = await plane.subscriber(scope, "t")
            pub = await plane.publisher(scope, "t")
            known = await plane.broker_directory()
            before = set(known.brokers)
            late.start()  # registers itself in etcd; both sides connect to it while running
            await eventually(
                lambda: len(set(known.brokers) - before) == 1, timeout=10, what="broker discovered"
            )
            await pub.wait_for_subscribers(len(known.brokers), timeout=20)
            await pub.publish("via every broker")
            assert (await sub.next(10)).decode() == "via every broker"
            late.stop()  # SIGTERM: the broker unregisters
            assert late.proc is not None
            assert late.proc.returncode == 0  # stopped by its handler: no record left to a lease's end
            await eventually(
                lambda: set(known.brokers) == before, timeout=15, what="broker gone from discovery"
            )
    finally:
        late.cleanup()


async def test_an_unreachable_broker_is_reported_not_a_hang(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from meshplane.launchers import free_port

    nowhere = f"tcp://127.0.0.1:{free_port()}"
    config = make_config(
        "zmq",
        "file",
        tmp_path,
        None,
        None,
        zmq_brokers=PlaneConfig.from_env(
            {"DYN_ZMQ_BROKER_URL": f"xsub={nowhere} , xpub={nowhere}"}
        ).zmq_brokers,
    )
    async with EventPlane(config) as plane:
        pub = await asyncio.wait_for(plane.publisher(Scope.namespace("x"), "t"), 5)
        await pub.publish(b"dropped, not blocking")
        with pytest.raises(TimeoutError, match="0 of 1 subscribers"):
            await pub.wait_for_subscribers(1, timeout=1)
        await eventually(lambda: "cannot reach broker" in caplog.text, timeout=10, what="the warning")


def test_broker_cli_serves_stats_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv")}
    proc = subprocess.Popen(
        [*MESHPLANE, "broker", "--xsub", "tcp://127.0.0.1:0", "--xpub", "tcp://127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    ready = json.loads(read_until(proc.stdout, r"\S", 60, "the broker's ready line")[-1])
    assert ready["registered"].startswith("v1/event_brokers/")
    records = list((tmp_path / "kv" / "v1" / "event_brokers").iterdir())
    assert len(records) == 1
    stats = run_cli("broker-stats", ready["stats"], timeout=30)
    assert json.loads(stats.stdout)["dropped"] == 0
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "broker stopped" in err
    assert list((tmp_path / "kv" / "v1" / "event_brokers").iterdir()) == []  # unregistered on the way out


def test_a_broker_stopped_as_soon_as_it_is_ready_still_unregisters(tmp_path: Path) -> None:
    """SIGTERM right after the ready line: it stops as cleanly as later, its record gone. (Its handler
    came after the ready line: such a stop killed it and left the record to its lease's end.)"""
    env = {**os.environ, "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv")}
    for _ in range(3):
        broker = BrokerProcess(extra_args=(), env=env)
        try:
            broker.start()
            broker.stop()  # SIGTERM, then SIGKILL after 5 s
            assert broker.proc is not None
            assert broker.proc.returncode == 0, broker.log_path.read_text()
            assert "broker stopped" in broker.log_path.read_text()
            assert list((tmp_path / "kv" / "v1" / "event_brokers").iterdir()) == []
        finally:
            broker.cleanup()


async def test_a_named_publisher_keeps_its_brokers_across_restarts(
    two_brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    """Seed 000's stable HRW hash: five lives of a publisher named by MESHPLANE_PUBLISHER_ID (a new plane,
    as a restarted process makes, and a new per-life publisher_id each) all send through one broker."""
    config = PlaneConfig.from_env(
        {"MESHPLANE_PUBLISHER_ID": "worker-7"},
        event_plane="zmq",
        discovery_backend="file",
        file_kv=tmp_path / "kv",
        zmq_brokers=tuple(b.address for b in two_brokers),
        broker_fanout=1,
    )
    scope = Scope.namespace(f"hrw{uuid.uuid4().hex[:6]}")
    before = [query_stats(b.stats_endpoint) for b in two_brokers]
    ids = set()
    async with EventPlane(config) as sub_plane:
        sub = await sub_plane.subscriber(scope, "t")
        for _ in range(5):
            async with EventPlane(config) as plane:
                pub = await plane.publisher(scope, "t")
                ids.add(pub.publisher_id)
                await pub.wait_for_subscribers(1, timeout=10)
                await pub.publish(b"x")
                assert (await sub.next(10)).publisher_id == pub.publisher_id
    assert len(ids) == 5  # (publisher_id, sequence) never repeats: deduplicating subscribers stay right
    after = [query_stats(b.stats_endpoint) for b in two_brokers]
    # The C relay counts frames: an event is 4 of them, a heartbeat (each life's goodbye) 4 more.
    used = [
        (a["messages_in"] - b["messages_in"])
        if a["relay"] == "python"
        else (a["frames_in"] - b["frames_in"]) // 4
        for a, b in zip(after, before, strict=True)
    ]
    assert sorted(used)[0] == 0, used  # all five lives through the same broker
    assert sorted(used)[1] >= 5, used


async def test_publisher_names_default_to_the_host_and_count_up_within_a_plane(tmp_path: Path) -> None:
    import socket

    from meshplane import EventPublisher
    from meshplane.core.records import publisher_identity

    scope = Scope.namespace(f"names{uuid.uuid4().hex[:6]}")
    config = make_config("mem", "mem", tmp_path, None, None)
    async with EventPlane(config) as plane:
        first, second = await plane.publisher(scope, "t"), await plane.publisher(scope, "t")
        other_topic = await plane.publisher(scope, "u")
        named = await EventPublisher.create(scope, "t", plane=plane, name="worker-7")
        host = socket.gethostname()
        assert [first.name, second.name, other_topic.name, named.name] == [
            host,
            f"{host}#1",
            host,
            "worker-7",
        ]
        assert named.identity == publisher_identity("worker-7", scope, "t")
        assert len({first.identity, second.identity, other_topic.identity}) == 3
        await first.close()
        assert (await plane.publisher(scope, "t")).name == host  # the lowest free ordinal, as after a restart
    async with EventPlane(config.replace(publisher_name="svc-a")) as plane:
        assert [(await plane.publisher(scope, "t")).name for _ in range(2)] == ["svc-a", "svc-a#1"]
