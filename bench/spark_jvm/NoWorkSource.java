package meshplane.bench;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A JVM data source that does no work: the same rows as the Python one in spark_ingest.py (one
 * pre-built batch, again and again), through Spark's own DataSource V2 API instead of PySpark's.
 * What a reader of meshplane's segment files in the JVM could reach at most.
 */
public final class NoWorkSource implements TableProvider {
  static final int PARTITIONS = 4;
  static final int BATCH_ROWS = 30_000;
  static final StructType SCHEMA = new StructType()
      .add("key", DataTypes.BinaryType)
      .add("value", DataTypes.BinaryType)
      .add("topic", DataTypes.StringType)
      .add("partition", DataTypes.IntegerType)
      .add("offset", DataTypes.LongType)
      .add("timestamp", DataTypes.TimestampType)
      .add("timestampType", DataTypes.IntegerType)
      .add("event_type", DataTypes.StringType)
      .add("id", DataTypes.StringType)
      .add("metadata", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType));

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new NoWorkTable(Long.parseLong(properties.get("events")));
  }

  private record NoWorkTable(long events) implements Table, SupportsRead {
    @Override
    public String name() {
      return "no-work";
    }

    @Override
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return () -> new Scan() {
        @Override
        public StructType readSchema() {
          return SCHEMA;
        }

        @Override
        public Batch toBatch() {
          return new Batch() {
            @Override
            public InputPartition[] planInputPartitions() {
              InputPartition[] parts = new InputPartition[PARTITIONS];
              Arrays.fill(parts, new Rows(events / PARTITIONS));
              return parts;
            }

            @Override
            public PartitionReaderFactory createReaderFactory() {
              return new Readers();
            }
          };
        }
      };
    }
  }

  private record Rows(long count) implements InputPartition {}

  private static final class Readers implements PartitionReaderFactory {
    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("columnar reads only");
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      ColumnarBatch batch = prebuilt();
      long rows = ((Rows) partition).count();
      return new PartitionReader<>() {
        private long left = rows;

        @Override
        public boolean next() {
          if (left <= 0) {
            return false;
          }
          batch.setNumRows((int) Math.min(BATCH_ROWS, left));
          left -= BATCH_ROWS;
          return true;
        }

        @Override
        public ColumnarBatch get() {
          return batch;
        }

        @Override
        public void close() {
          batch.close();
        }
      };
    }

    private static ColumnarBatch prebuilt() {
      OnHeapColumnVector[] columns = OnHeapColumnVector.allocateColumns(BATCH_ROWS, SCHEMA);
      byte[] value = new byte[100];
      Arrays.fill(value, (byte) 'x');
      byte[] topic = bytes("ingest");
      byte[] eventType = bytes("bench");
      byte[] id = bytes("0".repeat(24));
      for (int i = 0; i < BATCH_ROWS; i++) {
        columns[0].putByteArray(i, bytes("k" + (i % 100)));
        columns[1].putByteArray(i, value);
        columns[2].putByteArray(i, topic);
        columns[3].putInt(i, 0);
        columns[4].putLong(i, i);
        columns[5].putLong(i, 1_000_000_000_000_000L); // microseconds, as the Python source's
        columns[6].putInt(i, 1);
        columns[7].putByteArray(i, eventType);
        columns[8].putByteArray(i, id);
        columns[9].putArray(i, 0, 0); // an empty map
      }
      return new ColumnarBatch(columns);
    }

    private static byte[] bytes(String text) {
      return text.getBytes(StandardCharsets.UTF_8);
    }
  }
}
