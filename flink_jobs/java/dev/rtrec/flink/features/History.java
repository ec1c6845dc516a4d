package dev.rtrec.flink.features;

import java.io.IOException;
import java.util.ArrayList;

import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;

/**
 * A user's engagements for their recent lists, newest first; ties in time by item, then type, so a
 * replay gives the same lists whatever order they arrived in (as the SQL plan ordered them). A
 * list as of a time is the newest {@code 2 * history_length} at or before it; a sample keeps those
 * strictly before its impression and within the lookback.
 *
 * <p>Forgotten after {@code state_ttl_ms} of processing time without an engagement, as Flink's state
 * TTL forgot the lists of the SQL plan.
 */
final class History {
  /** A list cut for a record or a sample: items, types and times (or ages). */
  static final class Cut {
    static final Cut EMPTY = new Cut(new String[0], new byte[0], new long[0]);
    final String[] items;
    final byte[] types;
    final long[] times;

    Cut(String[] items, byte[] types, long[] times) {
      this.items = items;
      this.types = types;
      this.times = times;
    }

    String[] typeNames() {
      String[] out = new String[types.length];
      for (int k = 0; k < out.length; k++) {
        out[k] = Tile.typeName(types[k]);
      }
      return out;
    }
  }

  final ArrayList<String> items = new ArrayList<>();
  final ArrayList<Byte> types = new ArrayList<>();
  long[] times = new long[4];
  long writtenAt;

  int size() {
    return items.size();
  }

  private boolean newer(long time, String item, byte type, int k) {
    if (time != times[k]) {
      return time > times[k];
    }
    int byItem = item.compareTo(items.get(k));
    return byItem != 0 ? byItem < 0 : Tile.typeName(type).compareTo(Tile.typeName(types.get(k))) < 0;
  }

  /** Adds an engagement at processing time {@code now}; the list is forgotten first if its TTL ran out. */
  void add(long time, String item, byte type, long now, long ttlMs) {
    if (expired(now, ttlMs)) {
      items.clear();
      types.clear();
    }
    writtenAt = now;
    int n = items.size();
    int at = 0;
    while (at < n && !newer(time, item, type, at)) {
      at++;
    }
    if (n == times.length) {
      times = java.util.Arrays.copyOf(times, 2 * n);
    }
    System.arraycopy(times, at, times, at + 1, n - at);
    times[at] = time;
    items.add(at, item);
    types.add(at, type);
  }

  boolean expired(long now, long ttlMs) {
    return ttlMs > 0 && now - writtenAt > ttlMs && !items.isEmpty();
  }

  /** The index of the newest entry at or before {@code asOf}. */
  private int firstAtOrBefore(long asOf) {
    int k = 0;
    while (k < items.size() && times[k] > asOf) {
      k++;
    }
    return k;
  }

  /** The list as of {@code asOf} (its newest {@code keep} at or before it), with their times. */
  Cut asOf(long asOf, int keep, long now, long ttlMs) {
    if (expired(now, ttlMs)) {
      return Cut.EMPTY;
    }
    int from = firstAtOrBefore(asOf);
    int n = Math.min(keep, items.size() - from);
    String[] outItems = new String[n];
    byte[] outTypes = new byte[n];
    long[] outTimes = new long[n];
    for (int k = 0; k < n; k++) {
      outItems[k] = items.get(from + k);
      outTypes[k] = types.get(from + k);
      outTimes[k] = times[from + k];
    }
    return new Cut(outItems, outTypes, outTimes);
  }

  /**
   * A sample's list: of the list as of the impression (its newest {@code 2 * length}), those strictly
   * before it and at most {@code lookbackMs} old, at most {@code length}, with their ages.
   */
  Cut before(long impressionMs, int length, long lookbackMs, long now, long ttlMs) {
    if (expired(now, ttlMs) || length == 0) {
      return Cut.EMPTY;
    }
    int from = firstAtOrBefore(impressionMs);
    int end = Math.min(items.size(), from + 2 * length);
    ArrayList<Integer> kept = new ArrayList<>(length);
    for (int k = from; k < end && kept.size() < length; k++) {
      long age = impressionMs - times[k];
      if (age > 0 && age <= lookbackMs) {
        kept.add(k);
      }
    }
    String[] outItems = new String[kept.size()];
    byte[] outTypes = new byte[kept.size()];
    long[] ages = new long[kept.size()];
    for (int i = 0; i < kept.size(); i++) {
      int k = kept.get(i);
      outItems[i] = items.get(k);
      outTypes[i] = types.get(k);
      ages[i] = impressionMs - times[k];
    }
    return new Cut(outItems, outTypes, ages);
  }

  /**
   * Drops what no list can show any more: no read is as of a time before {@code floor}, so of the
   * entries at or before it only the newest {@code keep} can be in a list, and none older than the
   * lookback before it in a sample's.
   */
  void prune(long floor, int keep, long lookbackMs) {
    int from = firstAtOrBefore(floor);
    int end = items.size();
    int cut = Math.min(end, from + keep);
    while (cut > from && times[cut - 1] < floor - lookbackMs) {
      cut--;
    }
    if (cut < end) {
      items.subList(cut, end).clear();
      types.subList(cut, end).clear();
    }
  }

  void write(DataOutputSerializer out) throws IOException {
    out.writeLong(writtenAt);
    out.writeInt(items.size());
    for (int k = 0; k < items.size(); k++) {
      out.writeLong(times[k]);
      CompactSerializer.writeString(items.get(k), out);
      out.writeByte(types.get(k));
    }
  }

  static History read(DataInputDeserializer in) throws IOException {
    History h = new History();
    h.writtenAt = in.readLong();
    int n = in.readInt();
    h.times = new long[Math.max(4, n)];
    for (int k = 0; k < n; k++) {
      h.times[k] = in.readLong();
      h.items.add(CompactSerializer.readString(in));
      h.types.add(in.readByte());
    }
    return h;
  }
}
