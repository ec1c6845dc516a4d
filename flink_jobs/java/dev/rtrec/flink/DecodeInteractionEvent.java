package dev.rtrec.flink;

import java.io.ByteArrayInputStream;
import java.io.EOFException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.types.Row;

/**
 * Decodes one InteractionEvent from a Kafka value in the JVM, or says why it cannot.
 *
 * <p>Arguments: the value bytes, the record headers, the writer schemas it accepts (one per line:
 * the schema header value "InteractionEvent:&lt;fingerprint&gt;", a tab, the schema JSON; the current
 * version and every frozen one in schemas/history), the current (reader) schema JSON, the
 * accepted event-time range as epoch-ms offsets from now (past may be null: no limit), the earliest
 * accepted event time (epoch ms), the largest accepted value in bytes and the longest accepted id.
 * Records written with an older version are resolved to the current one, as the Python readers do.
 * The job passes the schemas in, so schemas/ stays their only copy.
 *
 * <p>Decoding is total: whatever the bytes, the result is a row, never an exception. A bad record
 * becomes a row whose {@code error} says why, so the job routes it to the dead-letter topic instead
 * of failing. Before Avro reads a value, every length in it is checked against the bytes that are
 * left ({@link LengthCheck}), so a forged string length can never make it allocate gigabytes.
 *
 * <p>Each record is decoded once per source. The source's rowtime ({@link EventTimeOf}, for the
 * watermark and again where the planner computes the column) and the job's decode of the same record
 * follow each other in one task thread, so the last result of the thread is kept and handed out again
 * for equal bytes, header and arguments within a second. The function also says it is not
 * deterministic (it reads the clock): otherwise the planner merges the view that decodes into its
 * readers and calls the decode once per field read (measured: ten calls per record in the samples'
 * source before).
 */
@FunctionHint(output = @DataTypeHint(
    "ROW<event_id STRING, user_id STRING, item_id STRING, event_type STRING, event_time_ms BIGINT, "
        + "dwell_ms BIGINT, `position` INT, session_id STRING, error STRING>"))
public class DecodeInteractionEvent extends ScalarFunction {
  private static final java.util.List<String> TYPES =
      Arrays.asList("impression", "click", "like", "cart", "order", "share");

  private transient String cachedWriters;
  private transient Map<String, GenericDatumReader<GenericRecord>> readers;
  private transient Map<String, Schema> writers;
  private transient BinaryDecoder decoder;
  /** The current schema's header, and a reader of its layout (null: none, every value the general way). */
  private transient String currentHeader;
  private transient CurrentEventReader current;

  /** How long a kept result may be handed out again: the accepted time range moves with the clock. */
  private static final long KEPT_FOR_MS = 1000;
  private static final ThreadLocal<Decoded> LAST = ThreadLocal.withInitial(Decoded::new);

  /** One decode and what it was decoded from. */
  private static final class Decoded {
    byte[] value;
    byte[] header;
    String writerSchemas;
    String readerSchemaJson;
    Long[] limits;
    long atMs;
    Row row;

    boolean isFor(byte[] v, byte[] h, String writers, String reader, Long[] lim, long now) {
      return row != null && now - atMs <= KEPT_FOR_MS && now >= atMs && Arrays.equals(value, v)
          && Arrays.equals(header, h) && writerSchemas.equals(writers) && readerSchemaJson.equals(reader)
          && Arrays.equals(limits, lim);
    }
  }

  @Override
  public boolean isDeterministic() {
    return false;
  }

  public Row eval(byte[] value, Map<String, byte[]> headers, String writerSchemas, String readerSchemaJson,
      Long maxPastMs, Long maxFutureMs, Long minTimeMs, Long maxValueBytes, Long maxIdLength) {
    byte[] header = headers == null ? null : headers.get("rtrec-schema");
    Long[] limits = {maxPastMs, maxFutureMs, minTimeMs, maxValueBytes, maxIdLength};
    long now = System.currentTimeMillis();
    Decoded last = LAST.get();
    if (last.isFor(value, header, writerSchemas, readerSchemaJson, limits, now)) {
      return last.row;
    }
    Row row = decodeTotally(value, headers, writerSchemas, readerSchemaJson, maxPastMs, maxFutureMs, minTimeMs,
        maxValueBytes, maxIdLength);
    last.value = value;
    last.header = header;
    last.writerSchemas = writerSchemas;
    last.readerSchemaJson = readerSchemaJson;
    last.limits = limits;
    last.atMs = now;
    last.row = row;
    return row;
  }

  private Row decodeTotally(byte[] value, Map<String, byte[]> headers, String writerSchemas, String readerSchemaJson,
      Long maxPastMs, Long maxFutureMs, Long minTimeMs, Long maxValueBytes, Long maxIdLength) {
    try {
      return decode(value, headers, writerSchemas, readerSchemaJson, maxPastMs, maxFutureMs, minTimeMs,
          maxValueBytes, maxIdLength);
    } catch (Exception | OutOfMemoryError | StackOverflowError e) {
      // the checks below should leave nothing to land here; if anything does, it is one dead letter
      return error("undecodable InteractionEvent: " + e.getClass().getSimpleName() + ": " + e.getMessage());
    }
  }

  private Row decode(byte[] value, Map<String, byte[]> headers, String writerSchemas, String readerSchemaJson,
      Long maxPastMs, Long maxFutureMs, long minTimeMs, long maxValueBytes, long maxIdLength) {
    if (!writerSchemas.equals(cachedWriters)) {
      readers = new HashMap<>();
      writers = new HashMap<>();
      currentHeader = readersByHeader(writerSchemas, readerSchemaJson, readers, writers);
      current = currentHeader == null ? null : CurrentEventReader.forSchema(writers.get(currentHeader));
      cachedWriters = writerSchemas;
    }
    byte[] header = headers == null ? null : headers.get("rtrec-schema");
    if (header == null) {
      return error("missing rtrec-schema header");
    }
    String headerText = new String(header, StandardCharsets.UTF_8);
    GenericDatumReader<GenericRecord> reader = readers.get(headerText);
    if (reader == null) {
      return error("unknown schema " + headerText + " (known: " + String.join(", ", readers.keySet()) + ")");
    }
    if (value == null) {
      return error("empty value (tombstone)");
    }
    if (value.length > maxValueBytes) {
      return error("value of " + value.length + " bytes is larger than flink.max_event_bytes (" + maxValueBytes
          + ")");
    }
    if (current != null && headerText.equals(currentHeader) && current.read(value)) {
      CurrentEventReader r = current;
      return checked(r.eventId, r.userId, r.itemId, r.eventType, r.eventTime, r.dwellMs, r.position, r.sessionId,
          maxPastMs, maxFutureMs, minTimeMs, maxIdLength);
    }
    String bad = LengthCheck.check(writers.get(headerText), value);
    if (bad != null) {
      return error("undecodable InteractionEvent: " + bad);
    }
    GenericRecord rec;
    try {
      ByteArrayInputStream in = new ByteArrayInputStream(value);
      decoder = DecoderFactory.get().directBinaryDecoder(in, decoder);
      rec = reader.read(null, decoder);
      if (in.available() > 0) {
        return error("undecodable InteractionEvent: " + in.available() + " trailing bytes");
      }
    } catch (EOFException e) {
      return error("undecodable InteractionEvent: truncated");
    } catch (Exception e) {
      return error("undecodable InteractionEvent: " + e.getClass().getSimpleName() + ": " + e.getMessage());
    }
    Object session = rec.get("session_id");
    return checked(str(rec.get("event_id")), str(rec.get("user_id")), str(rec.get("item_id")),
        str(rec.get("event_type")), (Long) rec.get("event_time"), (Long) rec.get("dwell_ms"),
        (Integer) rec.get("position"), session == null ? null : session.toString(), maxPastMs, maxFutureMs, minTimeMs,
        maxIdLength);
  }

  /** The decoded event as the job's row, or why it is not one. */
  private static Row checked(String eventId, String userId, String itemId, String type, long t, Long dwell,
      Integer position, String session, Long maxPastMs, Long maxFutureMs, long minTimeMs, long maxIdLength) {
    if (eventId.isEmpty() || userId.isEmpty() || itemId.isEmpty()) {
      return error("missing required field (event_id, user_id or item_id is empty)");
    }
    if (Math.max(eventId.length(), Math.max(userId.length(), itemId.length())) > maxIdLength) {
      return error("an id is longer than flink.max_id_length (" + maxIdLength + " characters)");
    }
    if (!TYPES.contains(type)) {
      return error("unknown event_type '" + type + "'");
    }
    long now = System.currentTimeMillis();
    if (t < minTimeMs) {
      return error("event_time " + t + " is before flink.min_event_time_ms (" + minTimeMs + ")");
    }
    if ((maxFutureMs != null && t > now + maxFutureMs) || (maxPastMs != null && t < now - maxPastMs)) {
      return error("event_time " + t + " is out of the accepted range (flink.max_future_skew_ms, "
          + "flink.max_event_age_ms)");
    }
    if (dwell != null && dwell < 0) {
      return error("dwell_ms " + dwell + " is negative");
    }
    if (position != null && position < 0) {
      return error("position " + position + " is negative");
    }
    return Row.of(eventId, userId, itemId, type, t, dwell, position, session, null);
  }

  /** Fills the readers and writers per header; returns the header of the reader schema itself, or null. */
  private static String readersByHeader(String writerSchemas, String readerSchemaJson,
      Map<String, GenericDatumReader<GenericRecord>> readers, Map<String, Schema> writers) {
    Schema readerSchema = new Schema.Parser().parse(readerSchemaJson);
    String current = null;
    for (String line : writerSchemas.split("\n")) {
      int tab = line.indexOf('\t');
      if (tab < 0) {
        throw new IllegalArgumentException("writer schema line without a tab: " + line);
      }
      Schema writer = new Schema.Parser().parse(line.substring(tab + 1));
      readers.put(line.substring(0, tab), new GenericDatumReader<>(writer, readerSchema));
      writers.put(line.substring(0, tab), writer);
      if (writer.equals(readerSchema)) {
        current = line.substring(0, tab);
      }
    }
    return current;
  }

  private static String str(Object o) {
    return o == null ? "" : o.toString();
  }

  private static Row error(String reason) {
    return Row.of(null, null, null, null, 0L, null, null, null, reason);
  }
}
