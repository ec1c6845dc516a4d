package dev.rtrec.flink;

import java.io.ByteArrayInputStream;
import java.io.EOFException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
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
 * <p>Arguments: the value bytes, the record headers, the expected schema header value
 * ("InteractionEvent:&lt;fingerprint&gt;"), the schema JSON (from schemas/avro, passed in by the
 * job so there is one copy of it), and the accepted event-time range as epoch-ms offsets from now
 * (past may be null: no limit). A bad record becomes a row whose {@code error} says why, so the job
 * routes it to the dead-letter topic instead of failing.
 */
@FunctionHint(output = @DataTypeHint(
    "ROW<event_id STRING, user_id STRING, item_id STRING, event_type STRING, event_time_ms BIGINT, "
        + "dwell_ms BIGINT, `position` INT, session_id STRING, error STRING>"))
public class DecodeInteractionEvent extends ScalarFunction {
  private static final long FLOOR_MS = 946_684_800_000L; // 2000-01-01: older is a unit error
  private static final String[] TYPES = {"impression", "click", "like", "cart", "order", "share"};

  private transient String cachedSchemaJson;
  private transient GenericDatumReader<GenericRecord> reader;
  private transient BinaryDecoder decoder;

  public Row eval(byte[] value, Map<String, byte[]> headers, String expectedHeader, String schemaJson,
      Long maxPastMs, Long maxFutureMs) {
    if (!schemaJson.equals(cachedSchemaJson)) {
      reader = new GenericDatumReader<>(new Schema.Parser().parse(schemaJson));
      cachedSchemaJson = schemaJson;
    }
    byte[] header = headers == null ? null : headers.get("rtrec-schema");
    if (header == null) {
      return error("missing rtrec-schema header");
    }
    String headerText = new String(header, StandardCharsets.UTF_8);
    if (!headerText.equals(expectedHeader)) {
      return error("unknown schema " + headerText + " (expected " + expectedHeader + ")");
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

  private static String str(Object o) {
    return o == null ? "" : o.toString();
  }

  private static Row error(String reason) {
    return Row.of(null, null, null, null, 0L, null, null, null, reason);
  }
}
