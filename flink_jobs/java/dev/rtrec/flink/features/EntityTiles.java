package dev.rtrec.flink.features;

import java.io.IOException;
import java.util.ArrayList;
import java.util.function.Consumer;

import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.table.data.RowData;

/**
 * One user's or item's tiles: per tile length of the spec, its tumbling windows with events, ascending
 * by start. The features topic gets a tile once it ends; the samples add a horizon's tiles up before
 * an impression's own tile.
 */
final class EntityTiles {
  /** Per tile length index, ascending by start. */
  final ArrayList<ArrayList<Tile>> byLength;

  EntityTiles(int lengths) {
    byLength = new ArrayList<>(lengths);
    for (int k = 0; k < lengths; k++) {
      byLength.add(new ArrayList<>(4));
    }
  }

  /**
   * Counts an event in its tile of every length. Returns the bits of the length indexes whose tile
   * it opened (their ends need a timer).
   */
  int add(FeatureSpec spec, long timeMs, byte type, long dwellMs, String counterpart) {
    int opened = 0;
    long hash = CounterpartHash.hash(counterpart);
    for (int k = 0; k < spec.tileLengths.length; k++) {
      long length = spec.tileLengths[k];
      long start = timeMs - Math.floorMod(timeMs, length);
      ArrayList<Tile> tiles = byLength.get(k);
      int at = tiles.size();
      while (at > 0 && tiles.get(at - 1).start > start) {
        at--;  // out of order: walk back from the newest
      }
      Tile tile;
      if (at > 0 && tiles.get(at - 1).start == start) {
        tile = tiles.get(at - 1);
      } else {
        tile = new Tile(start, spec.recordOf[k] >= 0);
        tiles.add(at, tile);
        opened |= 1 << k;
      }
      tile.add(type, dwellMs, hash);
    }
    return opened;
  }

  /**
   * The records of the tiles the features topic gets that end at {@code time}, to {@code out}. A
   * written tile's counterparts are dropped: from then on only its counts are read.
   */
  void writeEnded(FeatureSpec spec, Records records, String entityType, String entityId, long time,
      Consumer<RowData> out) {
    for (FeatureSpec.RecordTiles r : spec.records) {
      Tile t = at(spec.lengthIndex(r.lengthMs), time - r.lengthMs);
      if (t != null) {
        out.accept(records.tile(entityType, entityId, r, t, spec.sketchSize));
        t.counterparts = null;
      }
    }
  }

  /** The tile of length index {@code k} starting at {@code start}, or null. */
  Tile at(int k, long start) {
    ArrayList<Tile> tiles = byLength.get(k);
    for (int i = tiles.size() - 1; i >= 0; i--) {
      Tile t = tiles.get(i);
      if (t.start == start) {
        return t;
      }
      if (t.start < start) {
        return null;
      }
    }
    return null;
  }

  /**
   * The samples' features of an impression at {@code timeMs}: per sample horizon, the hopping window
   * that ends at the newest slide boundary at or before it ([end - horizon, end), so nothing at or
   * after the impression), added up from that slide's tiles; per horizon the spec's aggregates, written
   * into {@code out} from {@code offset}.
   */
  void sampleFeatures(FeatureSpec spec, long timeMs, float[] out, int offset) {
    int at = offset;
    for (int h = 0; h < spec.sampleHorizonMs.length; h++) {
      long slide = spec.sampleSlideMs[h];
      long end = timeMs - Math.floorMod(timeMs, slide);
      long from = end - spec.sampleHorizonMs[h];
      long impressions = 0;
      long clicks = 0;
      long likes = 0;
      long dwellSum = 0;
      long dwellCount = 0;
      ArrayList<Tile> tiles = byLength.get(spec.sampleLength[h]);
      for (int i = tiles.size() - 1; i >= 0; i--) {  // from the newest: the horizon is the recent end
        Tile t = tiles.get(i);
        if (t.start < from) {
          break;
        }
        if (t.start < end) {
          impressions += t.impressions;
          clicks += t.clicks;
          likes += t.likes;
          dwellSum += t.dwellSum;
          dwellCount += t.dwellCount;
        }
      }
      out[at++] = impressions;
      out[at++] = clicks;
      out[at++] = likes;
      out[at++] = (float) (impressions > 0 ? (double) clicks / impressions : 0.0);
      out[at++] = (float) (dwellCount > 0 ? (double) dwellSum / dwellCount : 0.0);
    }
  }

  /**
   * Drops the tiles nothing reads any more at watermark {@code watermark}: a tile is kept until it
   * ended (the features topic gets it then) and, where the samples read its length, as long after
   * that as they may (FeatureSpec.retentionByLength).
   */
  void prune(FeatureSpec spec, long watermark) {
    for (int k = 0; k < spec.tileLengths.length; k++) {
      long length = spec.tileLengths[k];
      long keepEndAfter = watermark - spec.retentionByLength[k];
      ArrayList<Tile> tiles = byLength.get(k);
      int drop = 0;
      while (drop < tiles.size() && tiles.get(drop).start + length <= keepEndAfter) {
        drop++;
      }
      if (drop > 0) {
        tiles.subList(0, drop).clear();
      }
    }
  }

  boolean isEmpty() {
    for (ArrayList<Tile> tiles : byLength) {
      if (!tiles.isEmpty()) {
        return false;
      }
    }
    return true;
  }

  void write(DataOutputSerializer out) throws IOException {
    out.writeInt(byLength.size());
    for (ArrayList<Tile> tiles : byLength) {
      out.writeInt(tiles.size());
      for (Tile t : tiles) {
        t.write(out);
      }
    }
  }

  static EntityTiles read(DataInputDeserializer in) throws IOException {
    int lengths = in.readInt();
    EntityTiles e = new EntityTiles(lengths);
    for (int k = 0; k < lengths; k++) {
      int n = in.readInt();
      ArrayList<Tile> tiles = e.byLength.get(k);
      for (int i = 0; i < n; i++) {
        tiles.add(Tile.read(in));
      }
    }
    return e;
  }
}
