"""The topic store's running partition count (kept as topics come, grow and go, instead of summed for
each new topic) always equals the sum over its topics, across a restart, and the limit holds on it."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.streams.errors import LimitReached
from meshplane.streams.service import StreamsConfig, StreamsService

NAMES = ["t0", "t1", "t2", "t3"]
MAX_PARTITIONS = 12

operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(1, 6)),
        st.tuples(st.just("grow"), st.sampled_from(NAMES), st.integers(1, 8)),
        st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just(0)),
        st.tuples(st.just("restart"), st.just(""), st.just(0)),
    ),
    max_size=25,
)


def counted(engine: StreamsService) -> int:
    return sum(len(topic.partitions) for topic in engine.topic_store.topics.values())


async def play(folder: Path, steps: list[tuple[str, str, int]]) -> None:
    config = StreamsConfig(data_dir=folder, fsync="never", max_partitions=MAX_PARTITIONS)
    engine = StreamsService(config)
    await engine.start()
    model: dict[str, int] = {}
    try:
        for op, name, count in steps:
            room = MAX_PARTITIONS - sum(model.values())
            if op == "create" and name not in model:
                if count > room:
                    with pytest.raises(LimitReached, match="partition limit"):
                        await engine.create_topic(name, count)
                else:
                    await engine.create_topic(name, count)
                    model[name] = count
            elif op == "grow" and name in model and count > model[name]:
                if count - model[name] > room:
                    with pytest.raises(LimitReached, match="partition limit"):
                        await engine.add_partitions(name, count)
                else:
                    await engine.add_partitions(name, count)
                    model[name] = count
            elif op == "delete":
                assert await engine.delete_topic(name) == (model.pop(name, None) is not None)
            elif op == "restart":
                await engine.close()
                engine = StreamsService(config)
                await engine.start()
            assert engine.topic_store.partition_count == counted(engine) == sum(model.values())
    finally:
        await engine.close()


@settings(max_examples=30)
@given(operations)
def test_the_partition_count_is_the_sum_over_topics_and_bounds_them(
    steps: list[tuple[str, str, int]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(play(Path(folder), steps))
