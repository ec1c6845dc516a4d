package dev.rtrec.flink.features;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Avro's binary encoding, written by hand into one reused buffer: zig-zag varints, little-endian
 * floats, length-prefixed UTF-8, arrays in one block. The operators write their records with it
 * instead of building rows that Flink's avro format turns into generic records and then encodes.
 * Not thread-safe: one per operator instance.
 */
final class AvroWriter {
  private byte[] buf = new byte[512];
  private int size;

  void reset() {
    size = 0;
  }

  byte[] toBytes() {
    return Arrays.copyOf(buf, size);
  }

  private void ensure(int more) {
    if (size + more > buf.length) {
      buf = Arrays.copyOf(buf, Math.max(2 * buf.length, size + more));
    }
  }

  void writeLong(long value) {
    ensure(10);
    long n = (value << 1) ^ (value >> 63);
    while ((n & ~0x7FL) != 0) {
      buf[size++] = (byte) ((n & 0x7F) | 0x80);
      n >>>= 7;
    }
    buf[size++] = (byte) n;
  }

  void writeInt(int value) {
    writeLong(value);  // an int's zig-zag varint is the long's of the same value
  }

  void writeDouble(double value) {
    ensure(8);
    long bits = Double.doubleToRawLongBits(value);
    for (int k = 0; k < 8; k++) {
      buf[size++] = (byte) (bits >>> (8 * k));
    }
  }

  void writeFloat(float value) {
    ensure(4);
    int bits = Float.floatToRawIntBits(value);
    for (int k = 0; k < 4; k++) {
      buf[size++] = (byte) (bits >>> (8 * k));
    }
  }

  void writeString(String value) {
    byte[] utf8 = value.getBytes(StandardCharsets.UTF_8);  // an ASCII string's bytes are copied at once
    writeLong(utf8.length);
    ensure(utf8.length);
    System.arraycopy(utf8, 0, buf, size, utf8.length);
    size += utf8.length;
  }

  /** Avro bytes: the length, then the first {@code length} bytes of {@code value}. */
  void writeBytes(byte[] value, int length) {
    writeLong(length);
    ensure(length);
    System.arraycopy(value, 0, buf, size, length);
    size += length;
  }

  /** The branch of a union: 0 for null in a ["null", T] union, 1 for T. */
  void writeIndex(int branch) {
    writeLong(branch);
  }

  /** An array's item count (then its items, then {@link #endArray}); nothing more for an empty one. */
  void startArray(int items) {
    writeLong(items);
  }

  void endArray(int items) {
    if (items > 0) {
      writeLong(0);
    }
  }

  void writeLongs(long[] values) {
    startArray(values.length);
    for (long v : values) {
      writeLong(v);
    }
    endArray(values.length);
  }

  void writeInts(int[] values) {
    startArray(values.length);
    for (int v : values) {
      writeInt(v);
    }
    endArray(values.length);
  }

  void writeFloats(float[] values) {
    startArray(values.length);
    for (float v : values) {
      writeFloat(v);
    }
    endArray(values.length);
  }

  void writeStrings(String[] values) {
    startArray(values.length);
    for (String v : values) {
      writeString(v);
    }
    endArray(values.length);
  }
}
