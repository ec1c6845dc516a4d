package dev.rtrec.flink.features;

/**
 * The 63-bit hash of a counterpart id in a tile's sketch: a tile keeps the k smallest distinct
 * hashes of its counterparts (a k-minimum-values sketch). Distinct ids do not add up across a
 * horizon's tiles, but these sketches merge: the union of the tiles' sets holds every hash of the
 * horizon up to the smallest largest hash of a full set, which gives the exact count while no tile saw
 * more than k ids and an estimate with a relative error near 1/sqrt(k) beyond
 * (feature_store.redis_store.distinct_counts). Non-negative, so signed order is their order.
 */
public final class CounterpartHash {
  private CounterpartHash() {}

  /** FNV-1a over the id's UTF-16 units, then MurmurHash3's finaliser so every bit depends on all. */
  public static long hash(String id) {
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
