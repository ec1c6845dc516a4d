package dev.rtrec.flink.features;

import java.util.Iterator;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.metrics.Counter;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.table.data.RowData;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * Keyed by user: counts each user's tiles and their pairs' base windows and writes them once they
 * end; keeps their engagements, for labels and recent lists; and writes an impression's sample once
 * the watermark has passed the base window holding the end of its attribution window, when every
 * engagement that may label it, and every tile before it, has arrived. Feature records are the main
 * output, samples go to {@code samples}.
 *
 * <p>Nothing that reaches it is dropped: the job's late filter already sent what is behind the
 * watermark to the dead letters, and every window closes on the same watermark as that filter judges.
 */
public final class UserStage extends KeyedProcessFunction<String, StagedEvent, RowData> {
  private static final long serialVersionUID = 1L;

  private final FeatureSpec spec;
  private final Records records;
  private final OutputTag<RowData> samples;
  private final int pairHorizonS;
  private final int listHorizonS;
  private final int[] userFeaturesAt;
  private final int[] itemFeaturesAt;
  private final int features;
  private transient ValueState<UserState> state;
  private transient Counter late;

  /**
   * {@code entities}: the entity types of the samples' feature vector in its order (each a block of
   * five aggregates per sample horizon).
   */
  UserStage(FeatureSpec spec, Records records, OutputTag<RowData> samples, int pairHorizonS, int listHorizonS,
      String[] entities) {
    this.spec = spec;
    this.records = records;
    this.samples = samples;
    this.pairHorizonS = pairHorizonS;
    this.listHorizonS = listHorizonS;
    int block = 5 * spec.sampleHorizonMs.length;
    this.features = block * entities.length;
    int user = -1;
    int item = -1;
    for (int k = 0; k < entities.length; k++) {
      if (entities[k].equals("user")) {
        user = k * block;
      } else if (entities[k].equals("item")) {
        item = k * block;
      } else {
        throw new IllegalArgumentException("no features of entity type " + entities[k]);
      }
    }
    this.userFeaturesAt = new int[] {user};
    this.itemFeaturesAt = new int[] {item};
  }

  @Override
  public void open(OpenContext context) {
    state = getRuntimeContext().getState(new ValueStateDescriptor<>("user", new UserState.Serializer()));
    late = getRuntimeContext().getMetricGroup().counter("numLateRecordsDropped");
  }

  private boolean lists() {
    return spec.samples && spec.historyLength > 0;
  }

  static String pairId(String user, String item) {
    return escape(user) + "|" + escape(item);
  }

  private static String escape(String id) {
    if (id.indexOf('\\') < 0 && id.indexOf('|') < 0) {
      return id;
    }
    return id.replace("\\", "\\\\").replace("|", "\\|");
  }

  @Override
  public void processElement(StagedEvent e, Context ctx, Collector<RowData> out) throws Exception {
    long watermark = ctx.timerService().currentWatermark();
    if (spec.late(e.timeMs, watermark)) {
      late.inc();
      return;
    }
    UserState s = state.value();
    if (s == null) {
      s = new UserState(new EntityTiles(spec.tileLengths.length));
    }
    long t = e.timeMs;
    Timers.opened(ctx.timerService(), spec, s.tiles.add(spec, t, e.type, e.dwellMs, e.itemId), t,
        spec.tileRetentionMs());
    long windowStart = t - Math.floorMod(t, spec.windowMs);
    long[] pair = s.pairWindow(windowStart).byItem.computeIfAbsent(e.itemId, k -> new long[UserState.PAIR_COUNTS]);
    if (e.type <= Tile.ORDER) {
      pair[e.type]++;
    }
    if (e.dwellMs >= 0) {
      pair[5] += e.dwellMs;
      pair[6]++;
    }
    if (spec.samples) {
      if (e.type != Tile.IMPRESSION) {
        s.addLabel(t, e.itemId);
        if (lists()) {
          s.history.add(t, e.itemId, e.type, ctx.timerService().currentProcessingTime(), spec.stateTtlMs);
          s.addListWindow(windowStart + spec.windowMs);
          // the list is kept a lookback after its newest engagement, then the state can go
          long quiet = spec.windowEnd(t) + spec.lookbackMs;
          long coarse = spec.tileLengths[spec.tileLengths.length - 1];
          ctx.timerService().registerEventTimeTimer(quiet - Math.floorMod(quiet, coarse) + coarse);
        }
      } else {
        String key = e.eventId + '\u0000' + e.itemId + '\u0000' + windowStart;
        UserState.Pending p = s.pending.get(key);
        if (p == null) {
          s.pending.put(key, new UserState.Pending(e.eventId, e.itemId, t, e.position, e.itemFeatures));
        } else {  // the same impression twice in a base window: one sample, as the SQL plan grouped them
          p.firstMs = Math.min(p.firstMs, t);
          p.timeMs = Math.max(p.timeMs, t);
          p.position = Math.max(p.position, e.position);
        }
        long due = sampleTime(t);
        s.nextSampleAt = Math.min(s.nextSampleAt, due);
        s.oldestPendingMs = Math.min(s.oldestPendingMs, t);
        ctx.timerService().registerEventTimeTimer(due);
      }
    }
    state.update(s);
  }

  /** When an impression's sample is written: every engagement within its attribution window has come. */
  long sampleTime(long timeMs) {
    return spec.windowEnd(timeMs + spec.attributionMs);
  }

  @Override
  public void onTimer(long time, OnTimerContext ctx, Collector<RowData> out) throws Exception {
    UserState s = state.value();
    if (s == null) {
      return;
    }
    String user = ctx.getCurrentKey();
    for (FeatureSpec.RecordTiles r : spec.records) {
      Tile t = s.tiles.at(spec.lengthIndex(r.lengthMs), time - r.lengthMs);
      if (t != null) {
        out.collect(records.tile("user", user, r, t, spec.sketchSize));
      }
    }
    while (!s.pairs.isEmpty() && s.pairs.get(0).start + spec.windowMs <= time) {
      UserState.PairWindow w = s.pairs.remove(0);
      for (java.util.Map.Entry<String, long[]> p : w.byItem.entrySet()) {
        out.collect(records.pair(pairId(user, p.getKey()), pairHorizonS, w.start, w.start + spec.windowMs, p.getValue()));
      }
    }
    long now = ctx.timerService().currentProcessingTime();
    while (!s.listWindows.isEmpty() && s.listWindows.get(0) <= time) {
      long end = s.listWindows.remove(0);
      History.Cut list = s.history.asOf(end - 1, 2 * spec.historyLength, now, spec.stateTtlMs);
      if (list.items.length > 0) {
        out.collect(records.recentList(user, listHorizonS, end - spec.windowMs, end, list));
      }
    }
    if (s.nextSampleAt <= time) {
      s.nextSampleAt = Long.MAX_VALUE;
      s.oldestPendingMs = Long.MAX_VALUE;
      for (Iterator<UserState.Pending> it = s.pending.values().iterator(); it.hasNext(); ) {
        UserState.Pending p = it.next();
        long due = sampleTime(p.timeMs);
        if (due <= time) {
          ctx.output(samples, sample(s, user, p, now));
          it.remove();
        } else {
          s.nextSampleAt = Math.min(s.nextSampleAt, due);
          s.oldestPendingMs = Math.min(s.oldestPendingMs, p.firstMs);
        }
      }
    }
    // no read from now on is as of a time before this: pending impressions, and events still to come
    // (not late: after the closed base windows)
    long floor = Math.min(s.oldestPendingMs, time - spec.windowMs);
    s.pruneLabels(floor);
    s.history.prune(floor, 2 * spec.historyLength, spec.lookbackMs);
    s.tiles.prune(spec, time, spec.tileRetentionMs(), spec.samples);
    if (s.isEmpty()) {
      state.clear();
    } else {
      state.update(s);
    }
  }

  private RowData sample(UserState s, String user, UserState.Pending p, long now) {
    float[] vector = new float[features];
    s.tiles.sampleFeatures(spec, p.timeMs, vector, userFeaturesAt[0]);
    System.arraycopy(p.itemFeatures, 0, vector, itemFeaturesAt[0], p.itemFeatures.length);
    boolean label = s.engaged(p.itemId, p.timeMs, p.timeMs + spec.attributionMs)
        || (p.firstMs != p.timeMs && s.engaged(p.itemId, p.firstMs, p.firstMs + spec.attributionMs));
    History.Cut recent = lists()
        ? s.history.before(p.timeMs, spec.historyLength, spec.lookbackMs, now, spec.stateTtlMs) : History.Cut.EMPTY;
    return records.sample(p.eventId, user, p.itemId, p.timeMs, label ? 1 : 0, vector, spec.featureSet, p.position, recent);
  }
}
