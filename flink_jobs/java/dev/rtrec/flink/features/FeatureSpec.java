package dev.rtrec.flink.features;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * What the feature operators compute, parsed from the text flink_jobs/feature_job.py writes from the
 * settings: space-separated {@code key=value} pairs, lists comma-separated, a list's entries'
 * parts colon-separated.
 *
 * <ul>
 *   <li>{@code window_ms}: the base window (the user-item pairs' and the lateness rule's);
 *   <li>{@code records}: per tile length written to the features topic for users and items,
 *       {@code length_ms:horizon_s:tile_of_horizons_s (+-joined, or empty):sketch (1 or 0)};
 *   <li>{@code sample_horizons}: the samples' horizons, {@code horizon_ms:slide_ms};
 *   <li>{@code attribution_ms}, {@code history_length}, {@code lookback_ms}, {@code state_ttl_ms},
 *       {@code sketch_size}, {@code samples} (1 or 0), {@code feature_set}.
 * </ul>
 */
public final class FeatureSpec implements Serializable {
  private static final long serialVersionUID = 1L;

  /** One tile length written to the features topic for users and items. */
  public static final class RecordTiles implements Serializable {
    private static final long serialVersionUID = 1L;
    public final long lengthMs;
    public final int horizonS;
    public final int[] tileOf;
    public final boolean sketch;

    RecordTiles(long lengthMs, int horizonS, int[] tileOf, boolean sketch) {
      this.lengthMs = lengthMs;
      this.horizonS = horizonS;
      this.tileOf = tileOf;
      this.sketch = sketch;
    }
  }

  public final long windowMs;
  public final RecordTiles[] records;
  public final long[] sampleHorizonMs;
  public final long[] sampleSlideMs;
  public final long attributionMs;
  public final int historyLength;
  public final long lookbackMs;
  public final long stateTtlMs;
  public final int sketchSize;
  public final boolean samples;
  public final String featureSet;

  /** The aggregates of each sample horizon, in their order (EntityTiles.sampleFeatures). */
  public static final String SAMPLE_AGGREGATES = "impressions,clicks,likes,ctr,dwell_mean_ms";

  private final long retentionMs;
  /** Per sample horizon, the index of its slide's tile length. */
  final int[] sampleLength;
  /** Per tile length, how long after their end its tiles are still read (0: only the records read them). */
  final long[] retentionByLength;
  /** Every tile length an entity counts in, ascending: the records' and the samples' slides. */
  public final long[] tileLengths;
  /** Per tile length: its entry in {@link #records}, or -1 when only the samples read it. */
  public final int[] recordOf;

  /** The text of what lays out the operators' state: the base window and the tiles of every length. */
  private final String geometry;

  FeatureSpec(Map<String, String> kv) {
    windowMs = Long.parseLong(required(kv, "window_ms"));
    geometry = "window_ms=" + windowMs + " records=" + kv.getOrDefault("records", "") + " sample_horizons="
        + kv.getOrDefault("sample_horizons", "");
    attributionMs = Long.parseLong(kv.getOrDefault("attribution_ms", "0"));
    historyLength = Integer.parseInt(kv.getOrDefault("history_length", "0"));
    lookbackMs = Long.parseLong(kv.getOrDefault("lookback_ms", "0"));
    stateTtlMs = Long.parseLong(kv.getOrDefault("state_ttl_ms", "0"));
    sketchSize = Integer.parseInt(kv.getOrDefault("sketch_size", "0"));
    samples = "1".equals(kv.getOrDefault("samples", "0"));
    featureSet = kv.getOrDefault("feature_set", "");
    List<RecordTiles> parsed = new ArrayList<>();
    for (String entry : list(kv.get("records"))) {
      String[] parts = entry.split(":", -1);
      int[] tileOf = parts[2].isEmpty() ? null
          : Arrays.stream(parts[2].split("\\+")).mapToInt(Integer::parseInt).toArray();
      parsed.add(new RecordTiles(Long.parseLong(parts[0]), Integer.parseInt(parts[1]), tileOf, "1".equals(parts[3])));
    }
    records = parsed.toArray(new RecordTiles[0]);
    List<String> horizons = list(kv.get("sample_horizons"));
    sampleHorizonMs = new long[horizons.size()];
    sampleSlideMs = new long[horizons.size()];
    for (int k = 0; k < horizons.size(); k++) {
      String[] parts = horizons.get(k).split(":");
      sampleHorizonMs[k] = Long.parseLong(parts[0]);
      sampleSlideMs[k] = Long.parseLong(parts[1]);
    }
    TreeSet<Long> lengths = new TreeSet<>();
    lengths.add(windowMs);
    for (RecordTiles r : records) {
      lengths.add(r.lengthMs);
    }
    if (samples) {
      for (long slide : sampleSlideMs) {
        lengths.add(slide);
      }
    }
    tileLengths = lengths.stream().mapToLong(Long::longValue).toArray();
    sampleLength = new int[sampleSlideMs.length];
    retentionByLength = new long[tileLengths.length];
    long longest = 0;
    for (int h = 0; h < sampleHorizonMs.length; h++) {
      sampleLength[h] = samples ? lengthIndex(sampleSlideMs[h]) : -1;
      if (samples) {  // an impression's sample reads the horizon before its tile, until the sample is due
        long read = sampleHorizonMs[h] + sampleSlideMs[h] + attributionMs + 2 * windowMs;
        retentionByLength[sampleLength[h]] = Math.max(retentionByLength[sampleLength[h]], read);
        longest = Math.max(longest, read);
      }
    }
    retentionMs = longest;
    if (samples && !SAMPLE_AGGREGATES.equals(kv.get("sample_aggregates"))) {
      throw new IllegalArgumentException("the operators write the sample aggregates " + SAMPLE_AGGREGATES
          + ", not " + kv.get("sample_aggregates"));
    }
    recordOf = new int[tileLengths.length];
    Arrays.fill(recordOf, -1);
    for (int r = 0; r < records.length; r++) {
      recordOf[lengthIndex(records[r].lengthMs)] = r;
    }
  }

  /**
   * A short hash of the state's geometry, for the operators' uids: a checkpoint of other windows,
   * horizons or slides then maps onto no operator, and the job refuses it (flink_jobs/runner.py says
   * what to do) instead of reading one tile length's state as another's.
   */
  public String geometryHash() {
    try {
      byte[] digest = MessageDigest.getInstance("SHA-256").digest(geometry.getBytes(StandardCharsets.UTF_8));
      StringBuilder hex = new StringBuilder();
      for (int k = 0; k < 6; k++) {
        hex.append(String.format("%02x", digest[k]));
      }
      return hex.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  public static FeatureSpec parse(String text) {
    Map<String, String> kv = new HashMap<>();
    for (String pair : text.trim().split("\\s+")) {
      int eq = pair.indexOf('=');
      if (eq <= 0) {
        throw new IllegalArgumentException("feature spec: '" + pair + "' is not key=value");
      }
      kv.put(pair.substring(0, eq), pair.substring(eq + 1));
    }
    return new FeatureSpec(kv);
  }

  private static String required(Map<String, String> kv, String key) {
    String value = kv.get(key);
    if (value == null) {
      throw new IllegalArgumentException("feature spec: " + key + " is missing");
    }
    return value;
  }

  private static List<String> list(String value) {
    List<String> out = new ArrayList<>();
    if (value != null && !value.isEmpty()) {
      out.addAll(Arrays.asList(value.split(",")));
    }
    return out;
  }

  public int lengthIndex(long lengthMs) {
    for (int k = 0; k < tileLengths.length; k++) {
      if (tileLengths[k] == lengthMs) {
        return k;
      }
    }
    throw new IllegalArgumentException("no tiles of " + lengthMs + " ms");
  }

  /** The end of the base window holding {@code timeMs}: an event is late once the watermark reaches it. */
  public long windowEnd(long timeMs) {
    return timeMs - Math.floorMod(timeMs, windowMs) + windowMs;
  }

  /** Whether an event's base window had closed at {@code watermark}, as the job's late filter judges. */
  public boolean late(long timeMs, long watermark) {
    return windowEnd(timeMs) <= watermark;
  }

  /** How long after its end the samples may still read a tile, the longest of any length. */
  public long tileRetentionMs() {
    return retentionMs;
  }
}
