"""The ``meshplane`` format for Spark: a Structured Streaming (and batch) source and sink.

    spark.dataSource.register(MeshplaneDataSource)
    events = (spark.readStream.format("meshplane")
              .option("url", "http://127.0.0.1:15500").option("subscribe", "orders")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100000).load())
    query = (rows.writeStream.format("meshplane").option("topic", "results")
             .option("checkpointLocation", "/tmp/ckpt").start())

Modelled on Spark's Kafka integration: the same option names and meanings
(:mod:`meshplane.spark.options`, checked at ``load()`` / ``save()``), the read side in
:mod:`meshplane.spark.reader`, the write side in :mod:`meshplane.spark.sink`.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from meshplane.spark.decode import column_types, spark_schema
from meshplane.spark.options import Options, SparkOptionError
from meshplane.spark.reader import DataLossError, MeshplaneBatchReader, MeshplaneStreamReader, columns_of
from meshplane.spark.sink import MeshplaneBatchWriter, MeshplaneStreamWriter, check_sink_schema

SAVE_MODES = (
    "the meshplane sink only appends: use mode append (or Spark's default, errorifexists, which appends "
    "too, as Kafka's sink does); overwrite is refused, as Kafka's sink refuses it, and Spark refuses ignore "
    "for Python data sources"
)


def with_user_schema(options: Options, schema: StructType) -> Options:
    """``options`` reading the columns a user-given schema names (Kafka's seven, say), once each is
    checked to be one of the source's with its type; a wrong one is refused naming it, before any
    task runs (PySpark does not show a source the schema at ``load()``)."""
    ours = dict(column_types(columns_of(options)))
    given = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    if given == list(ours.items()):
        return options
    for name, kind in given:
        if name not in ours:
            raise SparkOptionError(
                f"the schema given names column {name!r}, which the meshplane source does not have "
                f"(it has {', '.join(ours)})"
            )
        if kind != ours[name]:
            raise SparkOptionError(
                f"the schema given makes column {name} {kind}; the meshplane source's is {ours[name]}"
            )
    return dataclasses.replace(options, projection=tuple(name for name, _ in given))


class MeshplaneDataSource(DataSource):
    """``format("meshplane")``: see :mod:`meshplane.spark.options` for the options."""

    @classmethod
    def name(cls) -> str:
        return "meshplane"

    def schema(self) -> str:
        # Spark calls this at load(): a wrong option fails there, not after start().
        return spark_schema(columns_of(Options.for_source(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return MeshplaneBatchReader(with_user_schema(Options.for_source(self.options), schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MeshplaneStreamReader(with_user_schema(Options.for_source(self.options), schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = Options.for_sink(self.options)
        if overwrite:
            raise SparkOptionError(SAVE_MODES)
        check_sink_schema(schema, options)
        return MeshplaneBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = Options.for_sink(self.options)
        check_sink_schema(schema, options)
        return MeshplaneStreamWriter(options)


__all__ = ["DataLossError", "MeshplaneDataSource"]
