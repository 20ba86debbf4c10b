"""Fixtures the Spark test modules share (pyspark is imported only when a Spark test asks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from meshplane.launchers import StreamsServerProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="module")
def server() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess() as proc:
        yield proc.start()


@pytest.fixture(scope="session")  # one JVM for every module (the Spark tests run first: see conftest)
def spark() -> Iterator[SparkSession]:
    from meshplane.spark.pipeline import spark_session

    session = spark_session("meshplane-tests")  # the session `meshplane pipeline` and the benchmark use
    yield session
    session.stop()
