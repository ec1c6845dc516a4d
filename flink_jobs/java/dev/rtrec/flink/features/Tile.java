package dev.rtrec.flink.features;

import java.io.IOException;

import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;

/** One entity's counts over one tumbling window of a tile length. */
final class Tile {
  static final byte IMPRESSION = 0;
  static final byte CLICK = 1;
  static final byte LIKE = 2;
  static final byte CART = 3;
  static final byte ORDER = 4;
  static final byte SHARE = 5;
  private static final String[] TYPE_NAMES = {"impression", "click", "like", "cart", "order", "share"};

  long start;
  long impressions;
  long clicks;
  long likes;
  long carts;
  long orders;
  long dwellSum;
  long dwellCount;
  /**
   * The hashes of its distinct counterparts (a user's items, an item's users) until the features topic
   * got the tile; null where no record counts them, and after that (the samples read the counts only).
   */
  HashSet63 counterparts;

  Tile(long start, boolean distinct) {
    this.start = start;
    this.counterparts = distinct ? new HashSet63(4) : null;
  }

  static byte typeCode(String type) {
    switch (type) {
      case "impression":
        return IMPRESSION;
      case "click":
        return CLICK;
      case "like":
        return LIKE;
      case "cart":
        return CART;
      case "order":
        return ORDER;
      case "share":
        return SHARE;
      default:
        throw new IllegalArgumentException("unknown event_type '" + type + "'");
    }
  }

  static String typeName(byte code) {
    return TYPE_NAMES[code];
  }

  void add(byte type, long dwellMs, long counterpartHash) {
    switch (type) {
      case IMPRESSION:
        impressions++;
        break;
      case CLICK:
        clicks++;
        break;
      case LIKE:
        likes++;
        break;
      case CART:
        carts++;
        break;
      case ORDER:
        orders++;
        break;
      default:
        break;
    }
    if (dwellMs >= 0) {
      dwellSum += dwellMs;
      dwellCount++;
    }
    if (counterparts != null) {
      counterparts.add(counterpartHash);
    }
  }

  void write(DataOutputSerializer out) throws IOException {
    out.writeLong(start);
    out.writeLong(impressions);
    out.writeLong(clicks);
    out.writeLong(likes);
    out.writeLong(carts);
    out.writeLong(orders);
    out.writeLong(dwellSum);
    out.writeLong(dwellCount);
    out.writeInt(counterparts == null ? -1 : counterparts.size());
    if (counterparts != null) {
      counterparts.write(out);
    }
  }

  static Tile read(DataInputDeserializer in) throws IOException {
    Tile t = new Tile(in.readLong(), false);
    t.impressions = in.readLong();
    t.clicks = in.readLong();
    t.likes = in.readLong();
    t.carts = in.readLong();
    t.orders = in.readLong();
    t.dwellSum = in.readLong();
    t.dwellCount = in.readLong();
    int n = in.readInt();
    if (n >= 0) {
      t.counterparts = HashSet63.read(in, n);
    }
    return t;
  }
}
