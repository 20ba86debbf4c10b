"""Spark integration: ``format("meshplane")`` for Structured Streaming and batch.

Needs the ``spark`` extra: ``pip install 'meshplane[spark]'``.

>>> from meshplane.spark import register
>>> register(spark)
>>> df = spark.readStream.format("meshplane").option("topic", "orders").load()
"""

from __future__ import annotations

from typing import Any

try:
    from meshplane.spark.source import DataLossError, MeshplaneDataSource
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"meshplane.spark needs pyspark and pyarrow: pip install 'meshplane[spark]' ({exc})"
    ) from exc


def register(spark: Any) -> None:
    """Make ``format("meshplane")`` available in this Spark session."""
    spark.dataSource.register(MeshplaneDataSource)


__all__ = ["DataLossError", "MeshplaneDataSource", "register"]
