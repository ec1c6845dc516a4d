package dev.rtrec.flink.features;

/**
 * One impression's training sample on its way from the users' operator to {@link SampleBlocks},
 * which writes it alone (a TrainingSample) or with others (a TrainingSampleBlock).
 *
 * <p>A Flink POJO (public fields, a public constructor without arguments), so that it is never
 * serialized with Kryo.
 */
public class SampleRow {
  public String sampleId;
  public String userId;
  public String itemId;
  public long timeMs;
  public int label;
  public float[] features;
  public String featureSet;
  /** -1: none. */
  public int position;
  /** The user's engagements before it, newest first; as many types and ages. */
  public String[] recentItems;
  public String[] recentTypes;
  public long[] recentAgesMs;

  public SampleRow() {}

  SampleRow(String sampleId, String userId, String itemId, long timeMs, int label, float[] features,
      String featureSet, int position, History.Cut recent) {
    this.sampleId = sampleId;
    this.userId = userId;
    this.itemId = itemId;
    this.timeMs = timeMs;
    this.label = label;
    this.features = features;
    this.featureSet = featureSet;
    this.position = position;
    this.recentItems = recent.items;
    this.recentTypes = recent.typeNames();
    this.recentAgesMs = recent.times;
  }
}
