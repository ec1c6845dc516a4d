package dev.rtrec.flink.features;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Map;

import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;

/**
 * One user's state: their tiles, their pairs' open base windows, their engagements (for labels and
 * for their recent lists), the impressions waiting for their samples, and the base windows whose
 * list is still to be written.
 */
public final class UserState {
  /** A user-item pair's counts in one base window: impressions, clicks, likes, carts, orders, dwell sum, count. */
  static final int PAIR_COUNTS = 7;

  /** The user's pairs in one base window. */
  static final class PairWindow {
    final long start;
    final HashMap<String, long[]> byItem = new HashMap<>(4);

    PairWindow(long start) {
      this.start = start;
    }
  }

  /** An impression waiting for its sample: for its labels, and until the tiles before it closed. */
  static final class Pending {
    final String eventId;
    final String itemId;
    /** Its time; the same event twice in one base window is one sample, of the later time. */
    long timeMs;
    /** The earlier time of such a repeat (labels count from either), else timeMs. */
    long firstMs;
    int position;
    final float[] itemFeatures;
    /** When its sample is due. */
    final long dueMs;

    Pending(String eventId, String itemId, long timeMs, int position, float[] itemFeatures, long dueMs) {
      this.eventId = eventId;
      this.itemId = itemId;
      this.timeMs = timeMs;
      this.firstMs = timeMs;
      this.position = position;
      this.itemFeatures = itemFeatures;
      this.dueMs = dueMs;
    }

    /** Takes in a repeat of the same impression (same id, item and base window). */
    void merge(Pending repeat) {
      firstMs = Math.min(firstMs, repeat.firstMs);
      timeMs = Math.max(timeMs, repeat.timeMs);
      position = Math.max(position, repeat.position);
    }
  }

  void addPending(Pending p) {
    int at = pending.size();
    while (at > 0 && pending.get(at - 1).dueMs > p.dueMs) {
      at--;
    }
    pending.add(at, p);
  }

  final EntityTiles tiles;
  final ArrayList<PairWindow> pairs = new ArrayList<>(2);
  History history = new History();
  /** Engagements for labels, in arrival order: times and items. */
  final ArrayList<String> labelItems = new ArrayList<>(0);
  long[] labelTimes = new long[0];
  /** In the order their samples are due (UserStage.sampleTime), so the due ones are a prefix. */
  final ArrayList<Pending> pending = new ArrayList<>(4);
  /** Ends of base windows with engagements whose list record is still to be written, ascending. */
  final ArrayList<Long> listWindows = new ArrayList<>(0);

  UserState(EntityTiles tiles) {
    this.tiles = tiles;
  }

  boolean isEmpty() {
    return tiles.isEmpty() && pairs.isEmpty() && history.size() == 0 && labelItems.isEmpty() && pending.isEmpty()
        && listWindows.isEmpty();
  }

  PairWindow pairWindow(long start) {
    int at = pairs.size();
    while (at > 0 && pairs.get(at - 1).start > start) {
      at--;
    }
    if (at > 0 && pairs.get(at - 1).start == start) {
      return pairs.get(at - 1);
    }
    PairWindow w = new PairWindow(start);
    pairs.add(at, w);
    return w;
  }

  void addLabel(long timeMs, String item) {
    int n = labelItems.size();
    if (n == labelTimes.length) {
      labelTimes = java.util.Arrays.copyOf(labelTimes, Math.max(4, 2 * n));
    }
    labelTimes[n] = timeMs;
    labelItems.add(item);
  }

  /** Whether an engagement with the item followed within (from, to]. */
  boolean engaged(String item, long from, long to) {
    for (int k = 0; k < labelItems.size(); k++) {
      long t = labelTimes[k];
      if (t > from && t <= to && labelItems.get(k).equals(item)) {
        return true;
      }
    }
    return false;
  }

  /** Drops the label engagements at or before {@code floor}: no impression still to come is before them. */
  void pruneLabels(long floor) {
    int kept = 0;
    for (int k = 0; k < labelItems.size(); k++) {
      if (labelTimes[k] > floor) {
        labelTimes[kept] = labelTimes[k];
        labelItems.set(kept, labelItems.get(k));
        kept++;
      }
    }
    labelItems.subList(kept, labelItems.size()).clear();
  }

  void addListWindow(long end) {
    int at = listWindows.size();
    while (at > 0 && listWindows.get(at - 1) > end) {
      at--;
    }
    if (at == 0 || listWindows.get(at - 1) != end) {
      listWindows.add(at, end);
    }
  }

  /** Writes UserState for checkpoints (layout 1: a change needs the next number in Snapshot). */
  public static final class Serializer extends CompactSerializer<UserState> {
    private static final long serialVersionUID = 1L;

    @Override
    void write(UserState s, DataOutputSerializer out) throws IOException {
      s.tiles.write(out);
      out.writeInt(s.pairs.size());
      for (PairWindow w : s.pairs) {
        out.writeLong(w.start);
        out.writeInt(w.byItem.size());
        for (Map.Entry<String, long[]> e : w.byItem.entrySet()) {
          CompactSerializer.writeString(e.getKey(), out);
          for (long c : e.getValue()) {
            out.writeLong(c);
          }
        }
      }
      s.history.write(out);
      out.writeInt(s.labelItems.size());
      for (int k = 0; k < s.labelItems.size(); k++) {
        out.writeLong(s.labelTimes[k]);
        CompactSerializer.writeString(s.labelItems.get(k), out);
      }
      out.writeInt(s.pending.size());
      for (Pending p : s.pending) {
        out.writeLong(p.dueMs);
        CompactSerializer.writeString(p.eventId, out);
        CompactSerializer.writeString(p.itemId, out);
        out.writeLong(p.timeMs);
        out.writeLong(p.firstMs);
        out.writeInt(p.position);
        out.writeInt(p.itemFeatures.length);
        for (float f : p.itemFeatures) {
          out.writeFloat(f);
        }
      }
      out.writeInt(s.listWindows.size());
      for (long end : s.listWindows) {
        out.writeLong(end);
      }
    }

    @Override
    UserState read(DataInputDeserializer in) throws IOException {
      UserState s = new UserState(EntityTiles.read(in));
      int windows = in.readInt();
      for (int w = 0; w < windows; w++) {
        PairWindow pw = new PairWindow(in.readLong());
        int n = in.readInt();
        for (int k = 0; k < n; k++) {
          String item = CompactSerializer.readString(in);
          long[] counts = new long[PAIR_COUNTS];
          for (int c = 0; c < PAIR_COUNTS; c++) {
            counts[c] = in.readLong();
          }
          pw.byItem.put(item, counts);
        }
        s.pairs.add(pw);
      }
      s.history = History.read(in);
      int labels = in.readInt();
      for (int k = 0; k < labels; k++) {
        long t = in.readLong();
        s.addLabel(t, CompactSerializer.readString(in));
      }
      int pending = in.readInt();
      for (int k = 0; k < pending; k++) {
        long dueMs = in.readLong();
        String eventId = CompactSerializer.readString(in);
        String itemId = CompactSerializer.readString(in);
        long timeMs = in.readLong();
        long firstMs = in.readLong();
        int position = in.readInt();
        float[] features = new float[in.readInt()];
        for (int f = 0; f < features.length; f++) {
          features[f] = in.readFloat();
        }
        Pending p = new Pending(eventId, itemId, timeMs, position, features, dueMs);
        p.firstMs = firstMs;
        s.pending.add(p);
      }
      int lists = in.readInt();
      for (int k = 0; k < lists; k++) {
        s.listWindows.add(in.readLong());
      }
      return s;
    }

    @Override
    public TypeSerializerSnapshot<UserState> snapshotConfiguration() {
      return new Snapshot();
    }
  }

  /**
   * Restores {@link Serializer}: the layout version of what it writes, 2 (counterparts as 63-bit
   * hashes, strings as UTF-8, each value one length-prefixed block; 1 wrote the ids).
   */
  public static final class Snapshot extends LayoutSnapshot<UserState> {
    public Snapshot() {
      super(Serializer::new, 2);
    }
  }
}
