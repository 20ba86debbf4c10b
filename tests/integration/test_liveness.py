"""Liveness on real processes: heartbeats, timeouts, recovery, gaps, and the Tango-style callback API."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import nats
import pytest
import zmq
import zmq.asyncio

from meshplane import (
    EventEnvelope,
    EventGap,
    EventPlane,
    EventTimeout,
    PlaneConfig,
    PublisherRecovered,
    Scope,
    SubscriptionError,
)
from meshplane.launchers import NatsServer
from meshplane.transports.nats import flush_in_order
from tests.conftest import make_config
from tests.helpers import eventually

REPO = Path(__file__).resolve().parents[2]
PERIOD, MISSES = 0.25, 2


@pytest.fixture(params=["nats", "zmq"])
def live_config(request: pytest.FixtureRequest, tmp_path: Path) -> PlaneConfig:
    nats_server = request.getfixturevalue("nats_server") if request.param == "nats" else None
    return make_config(
        request.param,
        "file",
        tmp_path,
        nats_server,
        None,
        heartbeat_period=PERIOD,
        heartbeat_misses=MISSES,
        file_kv_ttl=30.0,
    )


@pytest.fixture(params=["nats", "zmq", "zmq-broker"])
def any_transport(request: pytest.FixtureRequest, tmp_path: Path) -> PlaneConfig:
    """NATS, ZeroMQ direct and ZeroMQ through two brokers."""
    liveness = {"heartbeat_period": PERIOD, "heartbeat_misses": MISSES, "file_kv_ttl": 30.0}
    if request.param == "nats":
        return make_config("nats", "file", tmp_path, request.getfixturevalue("nats_server"), None, **liveness)
    if request.param == "zmq":
        return make_config("zmq", "file", tmp_path, None, None, **liveness)
    brokers = request.getfixturevalue("session_brokers")
    return make_config(
        "zmq", "file", tmp_path, None, None, zmq_brokers=tuple(b.address for b in brokers), **liveness
    )


def env_of(config: PlaneConfig) -> dict[str, str]:
    env = {
        **os.environ,
        "DYN_EVENT_PLANE": config.event_plane,
        "NATS_SERVER": config.nats_server,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(config.file_kv),
        "MESHPLANE_HEARTBEAT_PERIOD": str(PERIOD),
        "MESHPLANE_HEARTBEAT_MISSES": str(MISSES),
        "MESHPLANE_FILE_KV_TTL": "30",
    }
    if config.zmq_brokers:
        xsubs = ";".join(b.xsub for b in config.zmq_brokers)
        xpubs = ";".join(b.xpub for b in config.zmq_brokers)
        env["DYN_ZMQ_BROKER_URL"] = f"xsub={xsubs} , xpub={xpubs}"
    return env


@pytest.fixture
def scope() -> Scope:
    return Scope.endpoint(f"live{uuid.uuid4().hex[:8]}", "worker", "generate")


async def start_ticker(config: PlaneConfig, scope: Scope) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.ticker",
        str(scope),
        "ticks",
        cwd=REPO,
        env=env_of(config),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    publisher_id = int((await asyncio.wait_for(proc.stdout.readline(), 30)).strip(), 16)
    return proc, publisher_id


class Recorder:
    """Everything a subscription's callback received, in order."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def __call__(self, item: Any) -> None:
        self.items.append(item)

    def of(self, kind: type) -> list[Any]:
        return [i for i in self.items if isinstance(i, kind)]


async def test_killed_publisher_times_out_and_its_restart_is_picked_up(
    any_transport: PlaneConfig, scope: Scope
) -> None:
    live_config = any_transport
    async with EventPlane(live_config) as plane:
        seen = Recorder()
        await plane.subscribe_event(scope, "ticks", seen, stateless=True)
        proc, first_id = await start_ticker(live_config, scope)
        try:
            await eventually(
                lambda: any(e.publisher_id == first_id for e in seen.of(EventEnvelope)), timeout=20
            )
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            killed_at = time.monotonic()
            await eventually(lambda: bool(seen.of(EventTimeout)), timeout=10, interval=0.005, what="timeout")
            elapsed = time.monotonic() - killed_at
            timeout = seen.of(EventTimeout)[0]
            assert timeout.publisher_id == first_id
            # Never before MISSES periods of silence; reported by the next look (every PERIOD / 2)
            # after that, with room for a loaded machine's scheduling (the deadline itself is exact).
            assert timeout.silent_for >= MISSES * PERIOD
            assert timeout.silent_for <= (MISSES + 1) * PERIOD + 1.0, timeout
            assert elapsed <= (MISSES + 1) * PERIOD + 1.0, elapsed
            # a new process (new publisher id, new port): picked up with nothing done to the subscriber
            proc, second_id = await start_ticker(live_config, scope)
            await eventually(
                lambda: any(e.publisher_id == second_id for e in seen.of(EventEnvelope)), timeout=20
            )
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_a_killed_publisher_times_out_while_another_floods_a_reader_that_keeps_up(
    live_config: PlaneConfig, scope: Scope
) -> None:
    """A flood the application reads slower than it comes (20 us and a turn of the loop per event; the
    flooder waits for room, so the queues stay full): messages always wait unread, yet the application
    keeps taking them, so silence is judged and the killed publisher is reported, late only by what was
    queued."""
    config = live_config.replace(send_hwm=5, receive_hwm=5, send_when_full="wait")
    async with EventPlane(config) as plane:
        seen = Recorder()

        async def slow_reader(item: Any) -> None:
            if isinstance(item, EventEnvelope) and item.publisher_id == flooder.publisher_id:
                until = time.perf_counter() + 20e-6
                while time.perf_counter() < until:
                    pass
                await asyncio.sleep(0)  # the rest of the application has its turns meanwhile
            seen(item)

        await plane.subscribe_event(scope, "ticks", slow_reader, stateless=True)
        proc, killed_id = await start_ticker(config, scope)
        flooder = await plane.publisher(scope, "ticks")
        flooding, flood_task = True, None

        async def flood() -> None:
            while flooding:
                await flooder.publish_many([b"x" * 100] * 2000)
                await asyncio.sleep(0)

        try:
            await eventually(
                lambda: any(e.publisher_id == killed_id for e in seen.of(EventEnvelope)), timeout=20
            )
            flood_task = asyncio.create_task(flood())
            await eventually(
                lambda: any(e.publisher_id == flooder.publisher_id for e in seen.of(EventEnvelope))
            )
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            killed_at = time.monotonic()
            await eventually(lambda: bool(seen.of(EventTimeout)), timeout=10, interval=0.005, what="timeout")
            assert seen.of(EventTimeout)[0].publisher_id == killed_id
            assert time.monotonic() - killed_at <= (MISSES + 1) * PERIOD + 2.0
        finally:
            flooding = False
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if flood_task is not None:
            await flood_task


async def test_frozen_publisher_times_out_then_recovers(any_transport: PlaneConfig, scope: Scope) -> None:
    live_config = any_transport
    async with EventPlane(live_config) as plane:
        seen = Recorder()
        proc, publisher_id = await start_ticker(live_config, scope)
        try:
            await plane.subscribe_event(scope, "ticks", seen)  # stateful: the publisher is registered
            await eventually(lambda: len(seen.of(EventEnvelope)) > 5, timeout=20)
            proc.send_signal(signal.SIGSTOP)
            await eventually(lambda: bool(seen.of(EventTimeout)), timeout=10, what="a timeout while frozen")
            count_at_timeout = len(seen.of(EventEnvelope))
            proc.send_signal(signal.SIGCONT)
            await eventually(lambda: bool(seen.of(PublisherRecovered)), timeout=20, what="a recovery")
            assert seen.of(PublisherRecovered)[0].publisher_id == publisher_id
            await eventually(
                lambda: len(seen.of(EventEnvelope)) > count_at_timeout + 5,
                timeout=20,
                what="events flowing again",
            )
            sequences = [e.sequence for e in seen.of(EventEnvelope)]
            assert sequences == sorted(set(sequences))  # in order, never twice
        finally:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("many", [False, True], ids=["publish", "publish_many"])
async def test_events_lost_to_a_high_water_mark_are_reported_as_exact_gaps(
    tmp_path: Path, scope: Scope, many: bool
) -> None:
    """One at a time, or in lists (batch messages of ~16 events: a whole one dropped at the mark)."""
    config = make_config(
        "zmq", "file", tmp_path, None, None, send_hwm=5, receive_hwm=5, heartbeat_period=PERIOD
    )
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(scope, "burst")
        gaps: list[EventGap] = []
        sub.on_notice(lambda n: gaps.append(n) if isinstance(n, EventGap) else None)
        pub = await plane.publisher(scope, "burst")
        await pub.wait_for_subscribers(1, timeout=10)
        total = 5000
        if many:
            for _ in range(total // 500):
                await pub.publish_many([b"x" * 1000] * 500)
        for i in range(0 if many else total):  # far faster than anyone drains a 5-message queue
            await pub.publish(i)
        delivered: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                delivered.append((await sub.next(PERIOD * 4)).sequence)
            except TimeoutError:
                if sub.stats.missing + len(delivered) == total:
                    break
        missing = set(range(total)) - set(delivered)
        reported = {s for g in gaps for s in range(g.missing_from, g.missing_to + 1)}
        assert missing, "the burst should have overflowed the high-water marks"
        assert reported == missing  # every lost event reported, with the right ranges, the tail included
        assert sub.stats.missing == len(missing)


def waiting_config(tmp_path: Path, **liveness: float) -> PlaneConfig:
    """ZeroMQ with 5-message queues and MESHPLANE_SEND_WHEN_FULL=wait: a burst makes publishers wait."""
    return make_config(
        "zmq", "file", tmp_path, None, None, send_hwm=5, receive_hwm=5, send_when_full="wait", **liveness
    )


@pytest.mark.parametrize("how", ["publish", "publish_many", "concurrent"])
async def test_send_when_full_wait_holds_the_publisher_back_and_loses_nothing(
    tmp_path: Path, scope: Scope, how: str
) -> None:
    """The same burst with MESHPLANE_SEND_WHEN_FULL=wait: publish (or one publish_many, or eight tasks
    publishing at once) waits at the high-water mark (held back while the subscriber reads nothing), and
    every event arrives in order, once, with the payload its sequence was returned for, none reported
    missing. Heartbeats every 20 ms: one sent while events wait for room must not announce them (the
    subscriber would report them missing and drop them as duplicates when they come)."""
    # the reader is held back on purpose: no timeouts here
    config = waiting_config(tmp_path, heartbeat_period=0.02, heartbeat_misses=1000)
    total, pad = 2000, b"x" * 10_000  # 20 MB: more than the socket buffers hold
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(scope, "burst")
        pub = await plane.publisher(scope, "burst")
        await pub.wait_for_subscribers(1, timeout=10)
        sent: dict[int, bytes] = {}

        async def publish_some(task: int, count: int) -> None:
            payloads = [b"%d:%d:" % (task, i) + pad for i in range(count)]
            if how == "publish_many":
                sent.update(zip(await pub.publish_many(payloads), payloads, strict=True))
                return
            for payload in payloads:
                sent[await pub.publish(payload)] = payload

        tasks = 8 if how == "concurrent" else 1
        publishing = asyncio.gather(*(publish_some(task, total // tasks) for task in range(tasks)))
        await eventually(lambda: pub._transport.waits > 0, timeout=10)  # type: ignore[attr-defined]
        assert not publishing.done()  # held back: the subscriber has read nothing yet
        got = [await sub.next(10) for _ in range(total)]
        await publishing
        assert [event.sequence for event in got] == list(range(total))
        assert [event.payload for event in got] == [sent[sequence] for sequence in range(total)]
        assert (sub.stats.gaps, sub.stats.missing, sub.stats.duplicates) == (0, 0, 0)


async def test_a_reader_behind_its_queue_does_not_time_out_a_live_publisher(
    tmp_path: Path, scope: Scope
) -> None:
    """An application that stops reading for longer than the liveness timeout, while the publisher waits
    for room (MESHPLANE_SEND_WHEN_FULL=wait): the publisher is not silent, its events wait unread, so no
    timeout is reported and no reconnection drops them; every event arrives."""
    config = waiting_config(tmp_path, heartbeat_period=PERIOD, heartbeat_misses=MISSES)
    total, pad = 300, b"x" * 10_000
    async with EventPlane(config) as plane:
        sub = await plane.subscriber(scope, "slow")
        pub = await plane.publisher(scope, "slow")
        await pub.wait_for_subscribers(1, timeout=10)
        await pub.publish(b"first")
        assert (await sub.next(10)).sequence == 0  # the subscriber has heard from the publisher
        publishing = asyncio.create_task(pub.publish_many([pad] * total))
        await eventually(lambda: pub._transport.waits > 0, timeout=10)  # type: ignore[attr-defined]
        await asyncio.sleep(PERIOD * MISSES * 4)  # the application reads nothing for four timeouts
        got = [(await sub.next(10)).sequence for _ in range(total)]
        await publishing
        assert got == list(range(1, total + 1))
        assert (sub.stats.timeouts, sub.stats.gaps, sub.stats.missing) == (0, 0, 0)


async def test_callbacks_stop_at_unsubscribe_and_may_subscribe(
    live_config: PlaneConfig, scope: Scope
) -> None:
    async with EventPlane(live_config) as plane:
        outer, inner = Recorder(), Recorder()
        inner_ids: list[int] = []

        async def subscribing_callback(item: Any) -> None:
            outer(item)
            if isinstance(item, EventEnvelope) and not inner_ids:  # subscribe from inside a callback
                inner_ids.append(await plane.subscribe_event(scope, "cb", inner, stateless=True))

        event_id = await plane.subscribe_event(scope, "cb", subscribing_callback, stateless=True)
        pub = await plane.publisher(scope, "cb")
        if live_config.event_plane == "zmq":
            await pub.wait_for_subscribers(1, timeout=10)
        await pub.publish("first")
        await eventually(lambda: bool(inner_ids), what="inner subscription made")
        if live_config.event_plane == "zmq":
            await pub.wait_for_subscribers(2, timeout=10)
        for i in range(10):
            await pub.publish(i)
        await eventually(lambda: len(inner.of(EventEnvelope)) == 10, what="inner subscription receives")
        await plane.unsubscribe_event(event_id)
        calls = len(outer.items)
        for i in range(10):
            await pub.publish(i)
        await eventually(
            lambda: len(inner.of(EventEnvelope)) == 20, what="the other subscription still receives"
        )
        assert len(outer.items) == calls  # nothing after unsubscribe returned
        await plane.unsubscribe_event(inner_ids[0])
        with pytest.raises(SubscriptionError, match="no subscription"):
            await plane.unsubscribe_event(event_id)


async def test_a_callback_may_unsubscribe_itself(live_config: PlaneConfig, scope: Scope) -> None:
    async with EventPlane(live_config) as plane:
        calls: list[Any] = []

        async def once(item: Any) -> None:
            calls.append(item)
            await plane.unsubscribe_event(event_id)

        event_id = await plane.subscribe_event(scope, "self", once, stateless=True)
        # The barrier: a second subscription gets the same events and a marker sent after them all.
        witness = Recorder()
        await plane.subscribe_event(scope, "self", witness, stateless=True)
        pub = await plane.publisher(scope, "self")
        if live_config.event_plane == "zmq":
            await pub.wait_for_subscribers(2, timeout=10)
        for i in range(5):
            await pub.publish(i)
        await eventually(lambda: len(calls) >= 1, what="the first call")
        await pub.publish("marker")
        await eventually(
            lambda: [e.decode() for e in witness.of(EventEnvelope)] == [0, 1, 2, 3, 4, "marker"],
            what="the marker after every event, at the witness",
        )
        assert [e.decode() for e in calls] == [0]


async def test_stateful_subscription_fails_fast_and_stateless_waits(
    live_config: PlaneConfig, scope: Scope
) -> None:
    async with EventPlane(live_config) as plane:
        started = time.monotonic()
        with pytest.raises(SubscriptionError, match=r"no publisher is registered.*stateless=True"):
            await plane.subscribe_event(scope, "nobody", Recorder())
        assert time.monotonic() - started < 5
        seen = Recorder()
        await plane.subscribe_event(scope, "nobody", seen, stateless=True)
        pub = await plane.publisher(scope, "nobody")
        if live_config.event_plane == "zmq":
            await pub.wait_for_subscribers(1, timeout=10)
        await pub.publish("late")
        await eventually(lambda: [e.decode() for e in seen.of(EventEnvelope)] == ["late"])


async def test_unreachable_discovery_fails_a_stateful_subscription_and_is_reported_to_a_stateless_one(
    tmp_path: Path, scope: Scope
) -> None:
    from meshplane.launchers import free_port

    config = make_config("zmq", "file", tmp_path, None, None, heartbeat_period=PERIOD).replace(
        discovery_backend="etcd", etcd_endpoints=(f"127.0.0.1:{free_port()}",), connect_timeout=0.5
    )
    async with EventPlane(config) as plane:
        with pytest.raises(SubscriptionError, match="cannot reach etcd"):
            await plane.subscribe_event(scope, "t", Recorder())
        seen = Recorder()
        await plane.subscribe_event(scope, "t", seen, stateless=True)
        await eventually(lambda: len(seen.items) >= 2, timeout=10, what="retries reported to the callback")
        assert all("cannot reach etcd" in str(e) for e in seen.items)


@pytest.fixture
async def raw_zmq_sub() -> AsyncIterator[zmq.asyncio.Socket]:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    yield sock
    sock.close(0)
    ctx.term()


async def test_heartbeats_never_reach_a_dynamo_consumer_as_events(
    tmp_path: Path, scope: Scope, nats_server: NatsServer, raw_zmq_sub: zmq.asyncio.Socket
) -> None:
    """A Dynamo subscriber keeps an envelope only when its topic is the subscribed topic."""
    for transport in ("zmq", "nats"):
        config = make_config(
            transport, "file", tmp_path / transport, nats_server, None, heartbeat_period=0.05
        )
        async with EventPlane(config) as plane:
            pub = await plane.publisher(scope, "kv")
            envelopes: list[dict[str, Any]] = []
            if transport == "zmq":
                assert pub.channel is not None
                raw_zmq_sub.setsockopt(zmq.SUBSCRIBE, b"kv")
                raw_zmq_sub.connect(pub.channel.zmq_endpoint or "")
                await pub.wait_for_subscribers(1, timeout=10)
            else:
                nc = await nats.connect(nats_server.url)
                raw = await nc.subscribe(scope.subject("kv"))
                await flush_in_order(nc, 5)
            for i in range(3):
                await pub.publish(i)
            await asyncio.sleep(0.5)  # ten heartbeat periods
            await pub.flush()
            if transport == "zmq":
                # heartbeats keep coming: read for a bounded time
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline and await raw_zmq_sub.poll(100):
                    frames = await raw_zmq_sub.recv_multipart()
                    assert struct.unpack(">BI", frames[3][:5])[0] == 1
                    envelopes.append(msgpack.unpackb(frames[3][5:]))
            else:
                # The server routed the events before answering the publisher's flush, and answers this
                # client's after writing them to it: all are in the subscription's queue then.
                await flush_in_order(nc, 5)
                while raw.pending_msgs:
                    envelopes.append(msgpack.unpackb((await raw.next_msg(1)).data))
                await nc.close()
            kept = [e for e in envelopes if e["topic"] == "kv"]  # what Dynamo 1.6.1 keeps
            assert [msgpack.unpackb(e["payload"]) for e in kept] == [0, 1, 2], (transport, len(envelopes))
            heartbeats = [e for e in envelopes if e["topic"] != "kv"]
            assert all(e["topic"] == "kv/__heartbeat__" for e in heartbeats)
            if transport == "zmq":
                assert heartbeats  # same socket: Dynamo sees them, and drops them by topic


async def test_a_publisher_that_closes_cleanly_is_not_reported_as_timed_out(
    live_config: PlaneConfig, scope: Scope, caplog: pytest.LogCaptureFixture
) -> None:
    """Even when it comes and goes between two looks of the subscriber's discovery watch (a short
    `meshplane pub`): its record is gone, so its silence is a departure, not a timeout."""
    caplog.set_level(logging.INFO, logger="meshplane.subscriber")
    async with EventPlane(live_config) as plane, EventPlane(live_config) as other:
        sub = await plane.subscriber(scope, "brief")
        pub = await other.publisher(scope, "brief")
        await pub.wait_for_subscribers(1, timeout=10)
        await pub.publish(b"hello, and goodbye")
        await pub.close()
        assert (await sub.next(10)).payload == b"hello, and goodbye"
        # The check that finds it past its deadline decides: it left (then it is forgotten) or timed out.
        departed = f"publisher {pub.publisher_id:x} of {scope}/brief left"
        await eventually(lambda: departed in caplog.text, timeout=PERIOD * (MISSES + 20), what=departed)
        assert sub.stats.timeouts == 0
        assert not [n for n in sub.recent_notices if isinstance(n, EventTimeout)]
