package dev.rtrec.flink;

import java.util.Map;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.types.Row;

/**
 * The event time (epoch ms) of an InteractionEvent value, or 0 when it is malformed: the source's
 * rowtime column. Malformed records are routed to the dead-letter topic by the job; a 0 time never
 * advances the watermark.
 */
public class EventTimeOf extends ScalarFunction {
  private final DecodeInteractionEvent decoder = new DecodeInteractionEvent();

  public @DataTypeHint("BIGINT NOT NULL") Long eval(byte[] value, Map<String, byte[]> headers,
      String writerSchemas, String readerSchemaJson, Long maxPastMs, Long maxFutureMs, Long minTimeMs,
      Long maxValueBytes, Long maxIdLength) {
    Row row = decoder.eval(value, headers, writerSchemas, readerSchemaJson, maxPastMs, maxFutureMs, minTimeMs,
        maxValueBytes, maxIdLength);
    return row.getField(8) == null ? (Long) row.getField(4) : 0L;
  }
}
