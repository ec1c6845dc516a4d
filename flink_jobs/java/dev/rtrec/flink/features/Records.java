package dev.rtrec.flink.features;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;

import org.apache.avro.Schema;
import org.apache.flink.table.data.GenericMapData;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.MapData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.runtime.typeutils.MapDataSerializer;
import org.apache.flink.table.types.logical.VarBinaryType;
import org.apache.flink.table.types.logical.VarCharType;

/**
 * The operators' output: FeatureRecords, TrainingSamples and TrainingSampleBlocks as Avro bytes, each
 * with its Kafka key and the schema header, as the rows the topics' sinks take ({@link #ROW_TYPE}).
 * The encoders write the fields in the order of the .avsc files (schemas/ is their only copy), which
 * the job passes in and which are checked against what is written here when the job is built.
 */
final class Records implements Serializable {
  private static final long serialVersionUID = 1L;

  /** A record as the sinks take it: key, Avro value, headers. */
  static final String ROW_TYPE = "ROW<`key` BYTES, `value` BYTES, `headers` MAP<STRING, BYTES>>";

  /** FeatureRecord's fields, as this class writes them. */
  static final String[] RECORD_FIELDS = {
    "entity_type:string", "entity_id:string", "horizon_s:int", "window_start:timestamp-millis",
    "window_end:timestamp-millis", "impressions:long", "clicks:long", "likes:long", "carts:long", "orders:long",
    "ctr:double", "dwell_sum_ms:long", "dwell_mean_ms:double", "distinct_counterparts:long",
    "recent_items:null|array<string>", "recent_types:null|array<string>", "recent_times_ms:null|array<long>",
    "dwell_count:long", "counterpart_hashes:null|array<long>", "tile_of_horizons_s:null|array<int>"};
  /** TrainingSampleBlock's fields, as this class writes them. */
  static final String[] BLOCK_FIELDS = {
    "count:int", "feature_set:string", "width:int", "sample_ids:bytes", "sample_id_ends:bytes", "user_ids:bytes",
    "user_id_ends:bytes", "item_ids:bytes", "item_id_ends:bytes", "event_times:bytes", "labels:bytes",
    "features:bytes", "positions:bytes", "recent_counts:bytes", "recent_items:bytes", "recent_item_ends:bytes",
    "recent_types:bytes", "recent_type_ends:bytes", "recent_ages_ms:bytes"};
  /** TrainingSample's fields, as this class writes them. */
  static final String[] SAMPLE_FIELDS = {
    "sample_id:string", "user_id:string", "item_id:string", "event_time:timestamp-millis", "label:int",
    "features:array<float>", "feature_set:string", "position:null|int", "recent_items:array<string>",
    "recent_types:array<string>", "recent_ages_ms:array<long>"};

  private final byte[] recordHeader;
  private final byte[] sampleHeader;
  private final byte[] blockHeader;
  private transient AvroWriter writer;
  private transient MapData recordHeaders;
  private transient MapData sampleHeaders;
  private transient MapData blockHeaders;
  private transient SampleColumns columns;

  /** The schemas' JSON and their header values (`rtrec-schema`); refuses schemas this class does not write. */
  Records(String recordSchema, String recordHeader, String sampleSchema, String sampleHeader, String blockSchema,
      String blockHeader) {
    check("FeatureRecord", recordSchema, RECORD_FIELDS);
    check("TrainingSample", sampleSchema, SAMPLE_FIELDS);
    check("TrainingSampleBlock", blockSchema, BLOCK_FIELDS);
    this.recordHeader = recordHeader.getBytes(StandardCharsets.UTF_8);
    this.sampleHeader = sampleHeader.getBytes(StandardCharsets.UTF_8);
    this.blockHeader = blockHeader.getBytes(StandardCharsets.UTF_8);
  }

  static void check(String name, String json, String[] written) {
    List<String> fields = new ArrayList<>();
    for (Schema.Field f : new Schema.Parser().parse(json).getFields()) {
      fields.add(f.name() + ":" + describe(f.schema()));
    }
    if (!fields.equals(Arrays.asList(written))) {
      throw new IllegalArgumentException(name + " has the fields " + fields + ", but the feature operators write "
          + Arrays.asList(written) + " (flink_jobs/java/.../features/Records.java): change both together");
    }
  }

  private static String describe(Schema s) {
    switch (s.getType()) {
      case UNION:
        StringBuilder out = new StringBuilder();
        for (Schema branch : s.getTypes()) {
          out.append(out.length() == 0 ? "" : "|").append(describe(branch));
        }
        return out.toString();
      case ARRAY:
        return "array<" + describe(s.getElementType()) + ">";
      case LONG:
        return s.getLogicalType() != null ? s.getLogicalType().getName() : "long";
      default:
        return s.getType().getName();
    }
  }

  private AvroWriter writer() {
    if (writer == null) {
      writer = new AvroWriter();
      recordHeaders = headers(recordHeader);
      sampleHeaders = headers(sampleHeader);
      blockHeaders = headers(blockHeader);
      columns = new SampleColumns();
    }
    writer.reset();
    return writer;
  }

  /** In Flink's binary layout, built once: a generic map was converted to it for every record sent. */
  private static MapData headers(byte[] header) {
    GenericMapData map = new GenericMapData(Collections.singletonMap(StringData.fromString("rtrec-schema"), header));
    return new MapDataSerializer(new VarCharType(VarCharType.MAX_LENGTH), new VarBinaryType(VarBinaryType.MAX_LENGTH))
        .toBinaryMap(map);
  }

  private RowData record(String key, AvroWriter w) {
    return GenericRowData.of(key.getBytes(StandardCharsets.UTF_8), w.toBytes(), recordHeaders);
  }

  private static void counts(AvroWriter w, String entityType, String entityId, int horizonS, long start, long end,
      long impressions, long clicks, long likes, long carts, long orders, long dwellSum, long dwellCount,
      long distinct) {
    w.writeString(entityType);
    w.writeString(entityId);
    w.writeInt(horizonS);
    w.writeLong(start);
    w.writeLong(end);
    w.writeLong(impressions);
    w.writeLong(clicks);
    w.writeLong(likes);
    w.writeLong(carts);
    w.writeLong(orders);
    w.writeDouble(impressions > 0 ? (double) clicks / impressions : 0.0);
    w.writeLong(dwellSum);
    w.writeDouble(dwellCount > 0 ? (double) dwellSum / dwellCount : 0.0);
    w.writeLong(distinct);
  }

  /** A user's or item's tile of {@code r}'s length. */
  RowData tile(String entityType, String entityId, FeatureSpec.RecordTiles r, Tile t, int sketchSize) {
    AvroWriter w = writer();
    counts(w, entityType, entityId, r.horizonS, t.start, t.start + r.lengthMs, t.impressions, t.clicks, t.likes,
        t.carts, t.orders, t.dwellSum, t.dwellCount, t.counterparts.size());
    w.writeIndex(0);  // no recent lists
    w.writeIndex(0);
    w.writeIndex(0);
    w.writeLong(t.dwellCount);
    if (r.sketch && sketchSize > 0) {
      w.writeIndex(1);
      w.writeLongs(smallestHashes(t, sketchSize));
    } else {
      w.writeIndex(0);
    }
    if (r.tileOf != null) {
      w.writeIndex(1);
      w.writeInts(r.tileOf);
    } else {
      w.writeIndex(0);
    }
    return record(entityId, w);
  }

  /** The k smallest distinct hashes of a tile's counterparts, ascending (CounterpartHash). */
  static long[] smallestHashes(Tile t, int k) {
    long[] hashes = t.counterparts.sorted();
    return hashes.length <= k ? hashes : Arrays.copyOf(hashes, k);
  }

  /** A user-item pair's base window. */
  RowData pair(String pairId, int horizonS, long start, long end, long[] c) {
    AvroWriter w = writer();
    counts(w, "user_item", pairId, horizonS, start, end, c[0], c[1], c[2], c[3], c[4], c[5], c[6], 1);
    w.writeIndex(0);
    w.writeIndex(0);
    w.writeIndex(0);
    w.writeLong(c[6]);
    w.writeIndex(0);
    w.writeIndex(0);
    return record(pairId, w);
  }

  /** A user's list as of a base window's end: horizon 0, every count 0. */
  RowData recentList(String userId, int horizonS, long start, long end, History.Cut list) {
    AvroWriter w = writer();
    counts(w, "user", userId, horizonS, start, end, 0, 0, 0, 0, 0, 0, 0, 0);
    w.writeIndex(1);
    w.writeStrings(list.items);
    w.writeIndex(1);
    w.writeStrings(list.typeNames());
    w.writeIndex(1);
    w.writeLongs(list.times);
    w.writeLong(0);
    w.writeIndex(0);
    w.writeIndex(0);
    return record(userId, w);
  }

  RowData sample(SampleRow s) {
    AvroWriter w = writer();
    w.writeString(s.sampleId);
    w.writeString(s.userId);
    w.writeString(s.itemId);
    w.writeLong(s.timeMs);
    w.writeInt(s.label);
    w.writeFloats(s.features);
    w.writeString(s.featureSet);
    if (s.position < 0) {
      w.writeIndex(0);
    } else {
      w.writeIndex(1);
      w.writeInt(s.position);
    }
    w.writeStrings(s.recentItems);
    w.writeStrings(s.recentTypes);
    w.writeLongs(s.recentAgesMs);
    return GenericRowData.of(s.userId.getBytes(StandardCharsets.UTF_8), w.toBytes(), sampleHeaders);
  }

  /** Samples of one feature set and width as one TrainingSampleBlock, keyed by the first one's id. */
  RowData sampleBlock(List<SampleRow> samples) {
    AvroWriter w = writer();
    SampleColumns c = columns.fill(samples);
    SampleRow first = samples.get(0);
    w.writeInt(samples.size());
    w.writeString(first.featureSet);
    w.writeInt(first.features.length);
    for (SampleColumns.Column column : c.inOrder()) {
      w.writeBytes(column.bytes(), column.size());
    }
    return GenericRowData.of(first.sampleId.getBytes(StandardCharsets.UTF_8), w.toBytes(), blockHeaders);
  }
}
