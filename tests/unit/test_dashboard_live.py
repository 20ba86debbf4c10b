"""The dashboard's live state over a real streams service: sampling, lag in time, bounded pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplane.core.streamlog import StoredEvent
from meshplane.dashboard.http import WRITE_TIMEOUT_SECS
from meshplane.dashboard.live import MAX_VIEWERS, Dashboard, Tail
from meshplane.streams.errors import LimitReached, http_status
from meshplane.streams.grants import Grant, Scope
from meshplane.streams.service import StreamsConfig, StreamsService


@pytest.fixture
def engine(tmp_path: Path) -> StreamsService:
    service = StreamsService(StreamsConfig(data_dir=tmp_path, fsync="never"))
    service.open()
    return service


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def events(n: int) -> list[StoredEvent]:
    return [StoredEvent(f"id{i}", "e", {"i": i}) for i in range(n)]


async def test_lag_in_events_and_in_time_of_a_group_that_stopped_committing(engine: StreamsService) -> None:
    clock = Clock()
    dashboard = Dashboard(engine, clock=clock)
    engine.topic_store.create("orders", num_partitions=1)
    engine.append_topic("orders", events(5))
    engine.group_store.create("g", "orders", 1, "round_robin", 30.0)
    engine.group_store.commit("g", 0, 2, None, None)
    stamp = engine.topic("orders").partitions[0].read(2, 1)[0].timestamp_ms
    clock.now = stamp / 1000 + 7.5
    group = dashboard.state(clock.now)["groups"][0]
    assert (group["lag"], group["partitions"][0]["committed"], group["partitions"][0]["end"]) == (3, 2, 5)
    assert group["lag_ms"] == 7500
    clock.now += 2
    assert dashboard.state(clock.now)["groups"][0]["lag_ms"] == 9500  # the same event, waiting longer


async def test_rates_and_lag_are_sampled_with_no_page_open(engine: StreamsService) -> None:
    clock = Clock()
    dashboard = Dashboard(engine, clock=clock)
    engine.topic_store.create("orders", num_partitions=2)
    await dashboard.tick()
    engine.append_topic("orders", events(20))
    clock.now += 2
    await dashboard.tick()
    assert dashboard.trends.series["in"][-1] == (clock.now, 10.0)
    assert dashboard.trends.series["topic:orders"][-1] == (clock.now, 10.0)


async def test_a_slow_page_gets_the_newest_state_never_a_queue_but_every_tail_frame(
    engine: StreamsService,
) -> None:
    dashboard = Dashboard(engine)
    await engine.create_room("chat")
    viewer = dashboard.join(None, Tail("room", "chat", None, 0))
    for n in range(10):
        await engine.publish_room("chat", "msg", n)
        await dashboard.tick()
    states = [f for f in viewer.pending if f.startswith(b"event: state")]
    tails = [f for f in viewer.pending if f.startswith(b"event: tail")]
    assert len(states) == 1
    assert len(tails) == 10
    assert viewer.tail is not None
    assert viewer.tail.next_offset == 10


async def test_pages_are_bounded(engine: StreamsService) -> None:
    dashboard = Dashboard(engine)
    viewers = [dashboard.join(None) for _ in range(MAX_VIEWERS)]
    with pytest.raises(LimitReached):
        dashboard.join(None)
    dashboard.leave(viewers[0])
    dashboard.join(None)


def test_the_docs_cite_the_page_limits() -> None:
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "dashboard.md").read_text().split())
    assert f"a page that stops reading is dropped after {WRITE_TIMEOUT_SECS:g} s" in text
    refused = http_status(LimitReached("65th"))
    assert f"At most {MAX_VIEWERS} pages are open at a time (then {refused})" in text


async def test_a_token_limited_to_a_prefix_sees_only_its_names(engine: StreamsService) -> None:
    dashboard = Dashboard(engine)
    for name in ("orders.eu", "billing"):
        engine.topic_store.create(name, num_partitions=1)
    engine.group_store.create("orders.eu-readers", "orders.eu", 1, "round_robin", 30.0)
    await dashboard.tick()
    limited = dashboard.join(Grant((Scope("read", "orders."),)))
    everyone = dashboard.join(None)
    await dashboard.tick()
    assert b'"billing"' in everyone.pending[-1]
    assert b'"billing"' not in limited.pending[-1]
    assert b'"orders.eu"' in limited.pending[-1]
    assert b"topic:billing" not in dashboard.hello(limited)
    assert b'"hidden":true' in limited.pending[-1]  # the event plane: only for tokens that read everything
