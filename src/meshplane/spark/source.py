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

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from meshplane.spark.decode import spark_schema
from meshplane.spark.options import Options, SparkOptionError
from meshplane.spark.reader import DataLossError, MeshplaneBatchReader, MeshplaneStreamReader, columns_of
from meshplane.spark.sink import MeshplaneBatchWriter, MeshplaneStreamWriter, check_sink_schema


class MeshplaneDataSource(DataSource):
    """``format("meshplane")``: see :mod:`meshplane.spark.options` for the options."""

    @classmethod
    def name(cls) -> str:
        return "meshplane"

    def schema(self) -> str:
        # Spark calls this at load(): a wrong option fails there, not after start().
        return spark_schema(columns_of(Options.for_source(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return MeshplaneBatchReader(Options.for_source(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MeshplaneStreamReader(Options.for_source(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = Options.for_sink(self.options)
        if overwrite:
            raise SparkOptionError(
                "the meshplane sink appends: save mode Overwrite is refused, as Kafka's sink does"
            )
        check_sink_schema(schema, options)
        return MeshplaneBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = Options.for_sink(self.options)
        check_sink_schema(schema, options)
        return MeshplaneStreamWriter(options)


__all__ = ["DataLossError", "MeshplaneDataSource"]
