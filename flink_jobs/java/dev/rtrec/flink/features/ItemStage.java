package dev.rtrec.flink.features;

import java.util.List;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.metrics.Counter;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.table.data.RowData;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;

/**
 * Keyed by item: counts each item's tiles and writes those the features topic gets once they end;
 * passes every event on to the users' operator, an impression once the item's tiles before it have
 * closed, with its item features (what the SQL plan's interval join on tiles gave it).
 */
public final class ItemStage extends KeyedProcessFunction<String, StagedEvent, StagedEvent> {
  private static final long serialVersionUID = 1L;

  private final FeatureSpec spec;
  private final Records records;
  private final OutputTag<RowData> itemRecords;
  private transient ValueState<ItemState> state;
  private transient Counter late;

  ItemStage(FeatureSpec spec, Records records, OutputTag<RowData> itemRecords) {
    this.spec = spec;
    this.records = records;
    this.itemRecords = itemRecords;
  }

  @Override
  public void open(OpenContext context) {
    state = getRuntimeContext().getState(new ValueStateDescriptor<>("item", new ItemState.Serializer()));
    late = getRuntimeContext().getMetricGroup().counter("numLateRecordsDropped");
  }

  /** When an impression's item features are final: every slide's tiles before it have closed. */
  long release(long timeMs) {
    long at = Long.MIN_VALUE;
    for (long slide : spec.sampleSlideMs) {
      long end = timeMs - Math.floorMod(timeMs, slide);
      at = Math.max(at, spec.windowEnd(end - 1));  // the base window holding the tiles' last instant
    }
    return at;
  }

  @Override
  public void processElement(StagedEvent e, Context ctx, Collector<StagedEvent> out) throws Exception {
    long timeMs = e.timeMs;
    long watermark = ctx.timerService().currentWatermark();
    if (spec.late(timeMs, watermark)) {
      late.inc();  // only where a source subtask idled and came back behind the others
      return;
    }
    ItemState s = state.value();
    if (s == null) {
      s = new ItemState(new EntityTiles(spec.tileLengths.length));
    }
    Timers.opened(ctx.timerService(), spec, s.tiles.add(spec, timeMs, e.type, e.dwellMs, e.userId), timeMs,
        spec.tileRetentionMs());
    if (e.type == Tile.IMPRESSION && spec.samples) {
      long release = release(timeMs);
      if (release <= watermark) {
        e.itemFeatures = itemFeatures(s, timeMs);
        out.collect(e);
      } else {
        s.held.add(after(s.held, timeMs), e);  // held in time order, so the due ones are a prefix
        ctx.timerService().registerEventTimeTimer(release);
      }
    } else {
      out.collect(e);
    }
    state.update(s);
  }

  /**
   * Where an impression at {@code timeMs} goes in {@code held}: after every one at or before it, so ties
   * leave in the order they came. A binary search, because an item's events come from every partition
   * of the events topic (they are keyed by user): on a backlog the source reads a partition a fetch at
   * a time, and a walk back from the end crossed up to a fetch of the other partition's impressions.
   */
  static int after(List<StagedEvent> held, long timeMs) {
    int lo = 0;
    int hi = held.size();
    if (hi == 0 || held.get(hi - 1).timeMs <= timeMs) {
      return hi;  // in order, as on a live stream
    }
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (held.get(mid).timeMs <= timeMs) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  private float[] itemFeatures(ItemState s, long timeMs) {
    float[] features = new float[5 * spec.sampleHorizonMs.length];
    s.tiles.sampleFeatures(spec, timeMs, features, 0);
    return features;
  }

  @Override
  public void onTimer(long time, OnTimerContext ctx, Collector<StagedEvent> out) throws Exception {
    ItemState s = state.value();
    if (s == null) {
      return;
    }
    String item = ctx.getCurrentKey();
    s.tiles.writeEnded(spec, records, "item", item, time, row -> ctx.output(itemRecords, row));
    int due = 0;
    while (due < s.held.size() && release(s.held.get(due).timeMs) <= time) {
      StagedEvent e = s.held.get(due++);
      e.itemFeatures = itemFeatures(s, e.timeMs);
      out.collect(e);
    }
    if (due > 0) {
      s.held.subList(0, due).clear();
    }
    s.tiles.prune(spec, time);
    if (s.isEmpty()) {
      state.clear();
    } else {
      state.update(s);
    }
  }
}
