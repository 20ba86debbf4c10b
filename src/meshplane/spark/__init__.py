"""Spark integration: ``format("meshplane")`` for Structured Streaming and batch.

Needs the ``spark`` extra: ``pip install 'meshplane[spark]'``.

>>> from meshplane.spark import register
>>> register(spark)
>>> df = spark.readStream.format("meshplane").option("topic", "orders").load()
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshplane.spark.source import DataLossError, MeshplaneDataSource


def __getattr__(name: str) -> Any:
    """The source is imported when first used: ``meshplane.spark.worker_python`` runs before PySpark
    can be imported quickly, and must not import it."""
    if name not in ("DataLossError", "MeshplaneDataSource"):
        raise AttributeError(f"module 'meshplane.spark' has no attribute {name!r}")
    try:
        source = importlib.import_module("meshplane.spark.source")
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            f"meshplane.spark needs pyspark and pyarrow: pip install 'meshplane[spark]' ({exc})"
        ) from exc
    return getattr(source, name)


def register(spark: Any, one_line_errors: bool = True, unix_socket_workers: bool = True) -> None:
    """Make ``format("meshplane")`` available in this Spark session, with Kafka's save modes; with
    ``one_line_errors`` (default), a Python source's or UDF's error is its message alone, without
    Python frames (see :mod:`meshplane.spark.kafka_compat`); with ``unix_socket_workers`` (default),
    Python workers started from now on move Arrow batches over Unix sockets, unless the session's
    conf chose (``spark.python.unix.domain.socket.enabled``): reads are faster (bench/spark_ingest.py)."""
    from meshplane.spark import kafka_compat

    # Spark's Python workers run `python3` from PATH unless told otherwise: behind pyenv's or conda's
    # shims that is an interpreter without meshplane. Unless the user chose one, they run this one.
    context = getattr(spark, "sparkContext", None)  # a Spark Connect session has none
    if context is not None and "PYSPARK_PYTHON" not in os.environ and context.pythonExec == "python3":
        context.pythonExec = sys.executable
    if context is not None and unix_socket_workers:
        _unix_socket_workers(context)
    spark.dataSource.register(__getattr__("MeshplaneDataSource"))
    kafka_compat.default_save_mode_appends()
    if one_line_errors:
        kafka_compat.one_line_errors(spark)


UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"


def _unix_socket_workers(context: Any) -> None:
    """Set Spark's Unix-socket setting in the running context's own conf (``spark.conf.set`` refuses
    core settings): Spark reads it when it makes a Python worker factory, so workers started after
    this use it. Executors on a cluster took their conf when they started: there it belongs in the
    session's builder or spark-submit."""
    conf = context._jsc.sc().conf()  # the live SparkConf (SparkEnv's), not a copy as getConf() is
    if conf.contains(UNIX_SOCKETS):
        return  # the user chose
    conf.set(UNIX_SOCKETS, "true")
    if not str(context.master).startswith("local"):
        logging.getLogger(__name__).warning(
            "meshplane: %s set for the driver's Python workers; executors already started keep theirs: "
            "set it in the session's builder to have it everywhere",
            UNIX_SOCKETS,
        )


__all__ = ["DataLossError", "MeshplaneDataSource", "register"]
