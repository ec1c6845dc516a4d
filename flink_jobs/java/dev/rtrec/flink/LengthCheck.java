package dev.rtrec.flink;

import org.apache.avro.Schema;

/**
 * Walks an Avro binary value as its writer schema lays it out and checks every length and count in
 * it against the bytes that are left, without allocating anything. Avro's reader allocates a string
 * or bytes field at its declared length before it reads it: one forged length made a 64-byte record
 * allocate gigabytes (OutOfMemoryError) and restart the job on it forever.
 */
final class LengthCheck {
  private final byte[] bytes;
  private int pos;

  private LengthCheck(byte[] bytes) {
    this.bytes = bytes;
  }

  /** Null when every length fits in `value`, else why not. */
  static String check(Schema writer, byte[] value) {
    LengthCheck walk = new LengthCheck(value);
    try {
      walk.skip(writer, 0);
      return null;
    } catch (IllegalStateException e) {
      return e.getMessage();
    }
  }

  private int left() {
    return bytes.length - pos;
  }

  private void need(long n, String what) {
    if (n < 0 || n > left()) {
      throw new IllegalStateException(what + " of " + n + " bytes, but only " + left() + " bytes are left");
    }
  }

  private long varLong() {
    long raw = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= bytes.length) {
        throw new IllegalStateException("truncated (a number runs past the end)");
      }
      int b = bytes[pos++] & 0xff;
      raw |= (long) (b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        return (raw >>> 1) ^ -(raw & 1);
      }
    }
    throw new IllegalStateException("malformed variable-length number");
  }

  private void skip(Schema s, int depth) {
    if (depth > 64) {
      throw new IllegalStateException("nested deeper than 64 levels");
    }
    switch (s.getType()) {
      case RECORD:
        for (Schema.Field f : s.getFields()) {
          skip(f.schema(), depth + 1);
        }
        return;
      case UNION: {
        long branch = varLong();
        if (branch < 0 || branch >= s.getTypes().size()) {
          throw new IllegalStateException("union branch " + branch + " does not exist");
        }
        skip(s.getTypes().get((int) branch), depth + 1);
        return;
      }
      case STRING:
      case BYTES: {
        long n = varLong();
        need(n, "a " + s.getType().getName());
        pos += (int) n;
        return;
      }
      case FIXED:
        need(s.getFixedSize(), "a fixed");
        pos += s.getFixedSize();
        return;
      case INT:
      case LONG:
      case ENUM:
        varLong();
        return;
      case FLOAT:
        need(4, "a float");
        pos += 4;
        return;
      case DOUBLE:
        need(8, "a double");
        pos += 8;
        return;
      case BOOLEAN:
        need(1, "a boolean");
        pos += 1;
        return;
      case NULL:
        return;
      case ARRAY:
      case MAP:
        for (long count = varLong(); count != 0; count = varLong()) {
          if (count < 0) {
            count = -count;
            varLong(); // the block's size in bytes
          }
          need(count, "an array or map block (one byte at least per item)");
          for (long i = 0; i < count; i++) {
            if (s.getType() == Schema.Type.MAP) {
              long n = varLong();
              need(n, "a map key");
              pos += (int) n;
              skip(s.getValueType(), depth + 1);
            } else {
              skip(s.getElementType(), depth + 1);
            }
          }
        }
        return;
      default:
        throw new IllegalStateException("unsupported Avro type " + s.getType());
    }
  }
}
