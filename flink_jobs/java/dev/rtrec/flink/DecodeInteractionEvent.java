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
 * version and every frozen one in schemas/history), the current (reader) schema JSON, and the
 * accepted event-time range as epoch-ms offsets from now (past may be null: no limit). Records
 * written with an older version are resolved to the current one, as the Python readers do. The
 * job passes the schemas in, so schemas/ stays their only copy. A bad record becomes a row whose
 * {@code error} says why, so the job routes it to the dead-letter topic instead of failing.
 */
@FunctionHint(output = @DataTypeHint(
    "ROW<event_id STRING, user_id STRING, item_id STRING, event_type STRING, event_time_ms BIGINT, "
        + "dwell_ms BIGINT, `position` INT, session_id STRING, error STRING>"))
public class DecodeInteractionEvent extends ScalarFunction {
  private static final long FLOOR_MS = 946_684_800_000L; // 2000-01-01: older is a unit error
  private static final String[] TYPES = {"impression", "click", "like", "cart", "order", "share"};

  private transient String cachedWriters;
  private transient Map<String, GenericDatumReader<GenericRecord>> readers;
  private transient BinaryDecoder decoder;

  public Row eval(byte[] value, Map<String, byte[]> headers, String writerSchemas, String readerSchemaJson,
      Long maxPastMs, Long maxFutureMs) {
    if (!writerSchemas.equals(cachedWriters)) {
      readers = readersByHeader(writerSchemas, readerSchemaJson);
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
    String eventId = str(rec.get("event_id"));
    String userId = str(rec.get("user_id"));
    String itemId = str(rec.get("item_id"));
    String type = str(rec.get("event_type"));
    if (eventId.isEmpty() || userId.isEmpty() || itemId.isEmpty()) {
      return error("missing required field (event_id, user_id or item_id is empty)");
    }
    if (!Arrays.asList(TYPES).contains(type)) {
      return error("unknown event_type '" + type + "'");
    }
    long t = (Long) rec.get("event_time");
    long now = System.currentTimeMillis();
    if (t < FLOOR_MS || (maxFutureMs != null && t > now + maxFutureMs)
        || (maxPastMs != null && t < now - maxPastMs)) {
      return error("event_time " + t + " is out of the accepted range");
    }
    Object dwell = rec.get("dwell_ms");
    Object position = rec.get("position");
    Object session = rec.get("session_id");
    return Row.of(eventId, userId, itemId, type, t, dwell == null ? null : (Long) dwell,
        position == null ? null : (Integer) position, session == null ? null : session.toString(), null);
  }

  private static Map<String, GenericDatumReader<GenericRecord>> readersByHeader(String writerSchemas,
      String readerSchemaJson) {
    Schema readerSchema = new Schema.Parser().parse(readerSchemaJson);
    Map<String, GenericDatumReader<GenericRecord>> byHeader = new HashMap<>();
    for (String line : writerSchemas.split("\n")) {
      int tab = line.indexOf('\t');
      if (tab < 0) {
        throw new IllegalArgumentException("writer schema line without a tab: " + line);
      }
      Schema writer = new Schema.Parser().parse(line.substring(tab + 1));
      byHeader.put(line.substring(0, tab), new GenericDatumReader<>(writer, readerSchema));
    }
    return byHeader;
  }

  private static String str(Object o) {
    return o == null ? "" : o.toString();
  }

  private static Row error(String reason) {
    return Row.of(null, null, null, null, 0L, null, null, null, reason);
  }
}
