"""The sink's commit protocol against a real `meshplane serve`: a task attempt stages its rows, the
driver's commit makes exactly the committed attempts' rows visible, once per batch, whatever order a
replayed attempt receives its rows in (after a shuffle it differs)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark import TaskContext
from pyspark.sql import Row

from meshplane.launchers import StreamsServerProcess
from meshplane.spark import sink
from meshplane.spark.options import Options
from tests.spark_support import stored_values

ROWS = 2500


@pytest.fixture(scope="module")
def server() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess() as proc:
        yield proc.start()


class FakeTask:
    """What the sink asks of Spark's TaskContext: the query, the batch, the partition."""

    def __init__(self, query: str, batch: int, partition: int = 0) -> None:
        self.properties = {"sql.streaming.queryId": query, "streaming.sql.batchId": str(batch)}
        self.partition = partition

    def getLocalProperty(self, name: str) -> str | None:
        return self.properties.get(name)

    def partitionId(self) -> int:
        return self.partition


def dies_after(rows: list[Any], count: int) -> Iterator[Any]:
    yield from rows[:count]
    raise RuntimeError("executor lost")


def test_a_replayed_attempt_given_its_rows_in_another_order_stores_each_row_once(
    server: StreamsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TaskContext, "get", staticmethod(lambda: FakeTask("query-1", 0)))
    rows = [Row(key=f"k{i % 7}", value=json.dumps({"i": i})) for i in range(ROWS)]
    writer = sink.MeshplaneStreamWriter(Options.for_sink({"url": server.url, "topic": "replayed"}))
    with pytest.raises(RuntimeError, match="executor lost"):
        writer.write(dies_after(rows, 1500))  # attempt 1 dies part-way
    message = writer.write(iter(random.Random(1).sample(rows, ROWS)))  # attempt 2, another order
    writer.commit([message], 0)
    values = stored_values(server.url, "replayed")
    assert (len(values), len(set(values))) == (ROWS, ROWS)
    # The driver dies after the commit, before Spark's commit log: the batch runs again, in yet
    # another order, and its commit adds nothing.
    again = writer.write(iter(random.Random(2).sample(rows, ROWS)))
    writer.commit([again], 0)
    assert sorted(stored_values(server.url, "replayed")) == list(range(ROWS))
