package dev.rtrec.flink.features;

import java.io.IOException;
import java.util.Arrays;

import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;

/**
 * A set of non-negative 63-bit hashes (CounterpartHash) by open addressing in one long array: a tile's
 * distinct counterparts, counted by their hashes. Two ids share a hash with a chance of about n^2 / 2^64
 * for n ids (under 1e-7 for a million in one tile); the set then counts them once. A set of the ids
 * themselves cost a map node per id and a hash of the string per event on top of this one.
 */
final class HashSet63 {
  private static final long EMPTY = -1L;
  private long[] slots;
  private int size;

  HashSet63(int capacity) {
    slots = new long[Integer.highestOneBit(Math.max(4, capacity) * 2 - 1) * 2];
    Arrays.fill(slots, EMPTY);
  }

  int size() {
    return size;
  }

  void add(long hash) {
    if (2 * (size + 1) > slots.length) {
      grow();
    }
    if (insert(slots, hash)) {
      size++;
    }
  }

  /** Whether {@code hash} was new to {@code table}. */
  private static boolean insert(long[] table, long hash) {
    int mask = table.length - 1;
    int at = (int) (hash ^ (hash >>> 29)) & mask;
    while (table[at] != EMPTY) {
      if (table[at] == hash) {
        return false;
      }
      at = (at + 1) & mask;
    }
    table[at] = hash;
    return true;
  }

  private void grow() {
    long[] old = slots;
    slots = new long[old.length * 2];
    Arrays.fill(slots, EMPTY);
    for (long hash : old) {
      if (hash != EMPTY) {
        insert(slots, hash);
      }
    }
  }

  /** The hashes, in the table's order, for a checkpoint. */
  void write(DataOutputSerializer out) throws IOException {
    for (long hash : slots) {
      if (hash != EMPTY) {
        out.writeLong(hash);
      }
    }
  }

  static HashSet63 read(DataInputDeserializer in, int size) throws IOException {
    HashSet63 set = new HashSet63(size);
    for (int k = 0; k < size; k++) {
      set.add(in.readLong());
    }
    return set;
  }

  /** The hashes, ascending. */
  long[] sorted() {
    long[] out = new long[size];
    int n = 0;
    for (long hash : slots) {
      if (hash != EMPTY) {
        out[n++] = hash;
      }
    }
    Arrays.sort(out);
    return out;
  }
}
