package dev.rtrec.flink.features;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;

/**
 * The byte columns of a TrainingSampleBlock (schemas/avro/TrainingSampleBlock.avsc): strings end to
 * end with each one's end as a little-endian int32, numbers as little-endian arrays. Reused from block
 * to block; not thread-safe.
 */
final class SampleColumns {
  /** A growing little-endian buffer. */
  static final class Column {
    private byte[] buf = new byte[1024];
    private int size;

    byte[] bytes() {
      return buf;
    }

    int size() {
      return size;
    }

    private void ensure(int more) {
      if (size + more > buf.length) {
        buf = Arrays.copyOf(buf, Math.max(2 * buf.length, size + more));
      }
    }

    void putLong(long v) {
      ensure(8);
      for (int k = 0; k < 8; k++) {
        buf[size++] = (byte) (v >>> (8 * k));
      }
    }

    void putInt(int v) {
      ensure(4);
      for (int k = 0; k < 4; k++) {
        buf[size++] = (byte) (v >>> (8 * k));
      }
    }

    void putFloat(float v) {
      putInt(Float.floatToRawIntBits(v));
    }

    void putByte(int v) {
      ensure(1);
      buf[size++] = (byte) v;
    }

    void put(byte[] utf8) {
      ensure(utf8.length);
      System.arraycopy(utf8, 0, buf, size, utf8.length);
      size += utf8.length;
    }
  }

  private final Column sampleIds = new Column();
  private final Column sampleIdEnds = new Column();
  private final Column userIds = new Column();
  private final Column userIdEnds = new Column();
  private final Column itemIds = new Column();
  private final Column itemIdEnds = new Column();
  private final Column eventTimes = new Column();
  private final Column labels = new Column();
  private final Column features = new Column();
  private final Column positions = new Column();
  private final Column recentCounts = new Column();
  private final Column recentItems = new Column();
  private final Column recentItemEnds = new Column();
  private final Column recentTypes = new Column();
  private final Column recentTypeEnds = new Column();
  private final Column recentAges = new Column();
  private final Column[] all = {sampleIds, sampleIdEnds, userIds, userIdEnds, itemIds, itemIdEnds, eventTimes, labels,
    features, positions, recentCounts, recentItems, recentItemEnds, recentTypes, recentTypeEnds, recentAges};

  /** The byte fields in the schema's order. */
  Column[] inOrder() {
    return all;
  }

  private static void string(Column values, Column ends, String s) {
    values.put(s.getBytes(StandardCharsets.UTF_8));
    ends.putInt(values.size());
  }

  SampleColumns fill(List<SampleRow> samples) {
    for (Column c : all) {
      c.size = 0;
    }
    for (SampleRow s : samples) {
      string(sampleIds, sampleIdEnds, s.sampleId);
      string(userIds, userIdEnds, s.userId);
      string(itemIds, itemIdEnds, s.itemId);
      eventTimes.putLong(s.timeMs);
      labels.putByte(s.label);
      for (float f : s.features) {
        features.putFloat(f);
      }
      positions.putInt(s.position < 0 ? -1 : s.position);
      recentCounts.putInt(s.recentItems.length);
      for (int k = 0; k < s.recentItems.length; k++) {
        string(recentItems, recentItemEnds, s.recentItems[k]);
        string(recentTypes, recentTypeEnds, s.recentTypes[k]);
        recentAges.putLong(s.recentAgesMs[k]);
      }
    }
    return this;
  }
}
