package dev.rtrec.flink;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.avro.Schema;

/**
 * Reads an InteractionEvent written with the current schema straight from its bytes: the layout below,
 * checked against the schema when the reader is made (none is made for another layout). Anything it
 * does not expect (a length past the end, a varint too long, an unknown union branch, bytes left over)
 * makes it give up with null, and the caller decodes the value the general way, which says what is
 * wrong with it. Avro's generic reader built a record, its Utf8 strings and boxed values per event.
 */
final class CurrentEventReader {
  /** The current schema's fields, as this reader reads them. */
  static final List<String> LAYOUT = Arrays.asList("event_id:string", "user_id:string", "item_id:string",
      "event_type:string", "event_time:long", "dwell_ms:null|long", "position:null|int", "session_id:null|string");

  private byte[] bytes;
  private int pos;
  private boolean bad;

  String eventId;
  String userId;
  String itemId;
  String eventType;
  long eventTime;
  Long dwellMs;
  Integer position;
  String sessionId;

  /** A reader for `schema`, or null when its fields are not {@link #LAYOUT}. */
  static CurrentEventReader forSchema(Schema schema) {
    List<String> fields = new ArrayList<>();
    for (Schema.Field f : schema.getFields()) {
      fields.add(f.name() + ":" + describe(f.schema()));
    }
    return fields.equals(LAYOUT) ? new CurrentEventReader() : null;
  }

  private static String describe(Schema s) {
    if (s.getType() == Schema.Type.UNION) {
      StringBuilder out = new StringBuilder();
      for (Schema branch : s.getTypes()) {
        out.append(out.length() == 0 ? "" : "|").append(branch.getType().getName());
      }
      return out.toString();
    }
    return s.getType().getName();
  }

  /** Whether `value` was read whole; the fields then hold it. */
  boolean read(byte[] value) {
    bytes = value;
    pos = 0;
    bad = false;
    eventId = string();
    userId = string();
    itemId = string();
    eventType = string();
    eventTime = varLong();
    dwellMs = branch() ? varLong() : null;
    position = branch() ? varInt() : null;
    sessionId = branch() ? string() : null;
    return !bad && pos == bytes.length;
  }

  private long varLong() {
    long n = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= bytes.length) {
        bad = true;
        return 0;
      }
      byte b = bytes[pos++];
      n |= (long) (b & 0x7F) << shift;
      if (b >= 0) {
        return (n >>> 1) ^ -(n & 1);
      }
    }
    bad = true;
    return 0;
  }

  /** At most five bytes, as Avro reads an int. */
  private Integer varInt() {
    int start = pos;
    long n = varLong();
    if (pos - start > 5 || n < Integer.MIN_VALUE || n > Integer.MAX_VALUE) {
      bad = true;
      return 0;
    }
    return (int) n;
  }

  /** A ["null", T] union's branch: false for null, true for T. */
  private boolean branch() {
    long index = varLong();
    if (index != 0 && index != 1) {
      bad = true;
    }
    return !bad && index == 1;
  }

  private String string() {
    long n = varLong();
    if (bad || n < 0 || n > bytes.length - pos) {
      bad = true;
      return null;
    }
    int start = pos;
    pos += (int) n;
    for (int k = start; k < pos; k++) {
      if (bytes[k] < 0) {
        return new String(bytes, start, (int) n, StandardCharsets.UTF_8);
      }
    }
    return new String(bytes, start, (int) n, StandardCharsets.ISO_8859_1);  // ASCII: its bytes are its chars
  }
}
