package dev.rtrec.flink.features;

import java.io.IOException;
import java.util.ArrayList;

import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;

/** One item's state: its tiles, and its impressions waiting for the tiles before them to close. */
public final class ItemState {
  final EntityTiles tiles;
  /** In time order. */
  final ArrayList<StagedEvent> held = new ArrayList<>(0);

  ItemState(EntityTiles tiles) {
    this.tiles = tiles;
  }

  boolean isEmpty() {
    return held.isEmpty() && tiles.isEmpty();
  }

  static void writeEvent(StagedEvent e, DataOutputSerializer out) throws IOException {
    CompactSerializer.writeString(e.eventId, out);
    CompactSerializer.writeString(e.userId, out);
    CompactSerializer.writeString(e.itemId, out);
    out.writeByte(e.type);
    out.writeLong(e.timeMs);
    out.writeLong(e.dwellMs);
    out.writeInt(e.position);
  }

  static StagedEvent readEvent(DataInputDeserializer in) throws IOException {
    return new StagedEvent(CompactSerializer.readString(in), CompactSerializer.readString(in), CompactSerializer.readString(in),
        in.readByte(), in.readLong(), in.readLong(), in.readInt());
  }

  /** Writes ItemState for checkpoints (layout 1: a change needs the next number in Snapshot). */
  public static final class Serializer extends CompactSerializer<ItemState> {
    private static final long serialVersionUID = 1L;

    @Override
    void write(ItemState s, DataOutputSerializer out) throws IOException {
      s.tiles.write(out);
      out.writeInt(s.held.size());
      for (StagedEvent e : s.held) {
        writeEvent(e, out);
      }
    }

    @Override
    ItemState read(DataInputDeserializer in) throws IOException {
      ItemState s = new ItemState(EntityTiles.read(in));
      int n = in.readInt();
      for (int k = 0; k < n; k++) {
        s.held.add(readEvent(in));
      }
      return s;
    }

    @Override
    public TypeSerializerSnapshot<ItemState> snapshotConfiguration() {
      return new Snapshot();
    }
  }

  /**
   * Restores {@link Serializer}: the layout version of what it writes, 2 (counterparts as 63-bit
   * hashes, strings as UTF-8, each value one length-prefixed block; 1 wrote the ids).
   */
  public static final class Snapshot extends LayoutSnapshot<ItemState> {
    public Snapshot() {
      super(Serializer::new, 2);
    }
  }
}
