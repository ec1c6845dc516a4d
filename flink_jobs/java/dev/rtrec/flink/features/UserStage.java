package dev.rtrec.flink.features;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

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
  private final OutputTag<SampleRow> samples;
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
  UserStage(FeatureSpec spec, Records records, OutputTag<SampleRow> samples, int pairHorizonS, int listHorizonS,
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
        long due = sampleTime(t);
        s.addPending(new UserState.Pending(e.eventId, e.itemId, t, e.position, e.itemFeatures, due));
        ctx.timerService().registerEventTimeTimer(due);
      }
    }
    state.update(s);
  }

  /**
   * When an impression's sample is written: once every engagement within the attribution window of
   * any impression of its base window has come (the same for the whole window, so repeats of an
   * impression in it are due together).
   */
  long sampleTime(long timeMs) {
    long windowStart = timeMs - Math.floorMod(timeMs, spec.windowMs);
    return spec.windowEnd(windowStart + spec.windowMs - 1 + spec.attributionMs);
  }

  @Override
  public void onTimer(long time, OnTimerContext ctx, Collector<RowData> out) throws Exception {
    UserState s = state.value();
    if (s == null) {
      return;
    }
    String user = ctx.getCurrentKey();
    s.tiles.writeEnded(spec, records, "user", user, time, out::collect);
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
    int due = 0;
    while (due < s.pending.size() && s.pending.get(due).dueMs <= time) {
      due++;
    }
    if (due > 0) {
      for (UserState.Pending p : once(s.pending.subList(0, due))) {
        ctx.output(samples, sample(s, user, p, now));
      }
      s.pending.subList(0, due).clear();
    }
    // no read from now on is as of a time before this: pending impressions (the first due is of the
    // earliest base window), and events still to come (not late: after the closed base windows)
    long floor = time - spec.windowMs;
    if (!s.pending.isEmpty()) {
      long first = s.pending.get(0).timeMs;
      floor = Math.min(floor, first - Math.floorMod(first, spec.windowMs));
    }
    s.pruneLabels(floor);
    s.history.prune(floor, 2 * spec.historyLength, spec.lookbackMs);
    s.tiles.prune(spec, time);
    if (s.isEmpty()) {
      state.clear();
    } else {
      state.update(s);
    }
  }

  /** The due impressions with each repeat of one (same id, item and base window) merged into one. */
  private List<UserState.Pending> once(List<UserState.Pending> due) {
    if (due.size() == 1) {
      return due;
    }
    Map<String, UserState.Pending> byEvent = new LinkedHashMap<>();
    for (UserState.Pending p : due) {
      String key = p.eventId + '\u0000' + p.itemId + '\u0000' + (p.timeMs - Math.floorMod(p.timeMs, spec.windowMs));
      UserState.Pending first = byEvent.putIfAbsent(key, p);
      if (first != null) {
        first.merge(p);
      }
    }
    return new ArrayList<>(byEvent.values());
  }

  private SampleRow sample(UserState s, String user, UserState.Pending p, long now) {
    float[] vector = new float[features];
    s.tiles.sampleFeatures(spec, p.timeMs, vector, userFeaturesAt[0]);
    System.arraycopy(p.itemFeatures, 0, vector, itemFeaturesAt[0], p.itemFeatures.length);
    boolean label = s.engaged(p.itemId, p.timeMs, p.timeMs + spec.attributionMs)
        || (p.firstMs != p.timeMs && s.engaged(p.itemId, p.firstMs, p.firstMs + spec.attributionMs));
    History.Cut recent = lists()
        ? s.history.before(p.timeMs, spec.historyLength, spec.lookbackMs, now, spec.stateTtlMs) : History.Cut.EMPTY;
    return new SampleRow(p.eventId, user, p.itemId, p.timeMs, label ? 1 : 0, vector, spec.featureSet, p.position,
        recent);
  }
}
