"""Fixtures the Spark test modules share (pyspark is imported only when a Spark test asks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from meshplane.launchers import StreamsServerProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The suite's Spark JVMs live seconds to a minute: compiled by C1 alone, with the serial collector,
# one starts and runs a small job with ~40% less CPU (14 s against 23 s on a 2-core machine), and
# nothing a test checks depends on the JIT or the collector. spark-submit's JVM (every session,
# driver and `up` pipeline), the launcher spark-class runs before it, a standalone master and worker.
JVM_QUICK_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
for _variable in ("SPARK_SUBMIT_OPTS", "SPARK_LAUNCHER_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_variable, JVM_QUICK_START)


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
