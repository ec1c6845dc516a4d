package dev.rtrec.flink;

import java.util.Arrays;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;

/**
 * The k smallest distinct hashes of the ids a window saw, ascending: a k-minimum-values sketch. Distinct
 * ids do not add up across a horizon's tiles, but these sketches merge: the union of the tiles' sets
 * holds every hash of the horizon up to the smallest largest hash of a full set, which gives the exact
 * count while no tile saw more than k ids and an estimate with a relative error near 1/sqrt(k) beyond
 * (feature_store.redis_store.distinct_counts). Hashes are 63-bit, non-negative, so signed order is their order.
 *
 * <p>The accumulator is a RAW value: the window state keeps the object as it is, instead of converting
 * an array to and from Flink's rows at every event.
 */
@FunctionHint(accumulator = @DataTypeHint(value = "RAW", bridgedTo = SmallestHashes.Sketch.class))
public class SmallestHashes extends AggregateFunction<long[], SmallestHashes.Sketch> {

  /** The smallest hashes seen so far, ascending, at most {@code limit}. */
  public static class Sketch {
    public long[] hashes = new long[8];
    public int size;
    public int limit;

    void add(long hash) {
      int at = Arrays.binarySearch(hashes, 0, size, hash);
      if (at >= 0) {
        return;
      }
      at = -at - 1;
      if (at >= limit) {
        return;
      }
      if (size == hashes.length && size < limit) {
        hashes = Arrays.copyOf(hashes, Math.min(limit, 2 * size));
      }
      int kept = Math.min(size, limit - 1);
      System.arraycopy(hashes, at, hashes, at + 1, kept - at);
      hashes[at] = hash;
      size = kept + 1;
    }
  }

  @Override
  public Sketch createAccumulator() {
    return new Sketch();
  }

  public void accumulate(Sketch acc, String id, Integer limit) {
    if (id == null || limit == null || limit < 1) {
      return;
    }
    acc.limit = limit;
    acc.add(hash(id));
  }

  public void merge(Sketch acc, Iterable<Sketch> others) {
    for (Sketch other : others) {
      acc.limit = Math.max(acc.limit, other.limit);
      for (int k = 0; k < other.size; k++) {
        acc.add(other.hashes[k]);
      }
    }
  }

  @Override
  public long[] getValue(Sketch acc) {
    return Arrays.copyOf(acc.hashes, acc.size);
  }

  /** FNV-1a over the id's UTF-16 units, then MurmurHash3's finaliser so every bit depends on all. */
  static long hash(String id) {
    long h = 0xcbf29ce484222325L;
    for (int k = 0; k < id.length(); k++) {
      h = (h ^ id.charAt(k)) * 0x100000001b3L;
    }
    h ^= h >>> 33;
    h *= 0xff51afd7ed558ccdL;
    h ^= h >>> 33;
    h *= 0xc4ceb9fe1a85ec53L;
    h ^= h >>> 33;
    return h >>> 1;
  }
}
