package dev.rtrec.flink;

import java.util.ArrayList;
import java.util.List;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;
import org.apache.flink.types.Row;

/**
 * A sample's recent engagements: over the rows of one impression, the user's list as of the
 * impression time ({@link RecentEngagements}, carried by one of the rows), cut to the engagements
 * strictly before the impression and within the lookback, at most {@code maxItems}, with their ages.
 * Rows without a list add nothing; no list gives empty arrays.
 */
@FunctionHint(output = @DataTypeHint(
    "ROW<items ARRAY<STRING NOT NULL> NOT NULL, types ARRAY<STRING NOT NULL> NOT NULL, "
        + "ages_ms ARRAY<BIGINT NOT NULL> NOT NULL>"))
public class RecentBefore extends AggregateFunction<Row, RecentBefore.Cut> {

  /** The list seen so far and how to cut it. */
  public static class Cut {
    public String[] items = new String[0];
    public String[] types = new String[0];
    public long[] times = new long[0];
    public long impressionMs;
    public long lookbackMs;
    public int maxItems;
  }

  @Override
  public Cut createAccumulator() {
    return new Cut();
  }

  public void accumulate(Cut acc, String[] items, String[] types, Long[] times, Long impressionMs, Long lookbackMs,
      Integer maxItems) {
    if (impressionMs != null) {
      acc.impressionMs = impressionMs;
    }
    if (lookbackMs != null) {
      acc.lookbackMs = lookbackMs;
    }
    if (maxItems != null) {
      acc.maxItems = maxItems;
    }
    if (items == null || types == null || times == null) {
      return;
    }
    int n = Math.min(items.length, Math.min(types.length, times.length));
    acc.items = new String[n];
    acc.types = new String[n];
    acc.times = new long[n];
    for (int k = 0; k < n; k++) {
      acc.items[k] = items[k];
      acc.types[k] = types[k];
      acc.times[k] = times[k] == null ? Long.MIN_VALUE : times[k];
    }
  }

  public void merge(Cut acc, Iterable<Cut> others) {
    for (Cut other : others) {
      if (other.items.length > 0) {
        acc.items = other.items;
        acc.types = other.types;
        acc.times = other.times;
      }
      acc.impressionMs = Math.max(acc.impressionMs, other.impressionMs);
      acc.lookbackMs = Math.max(acc.lookbackMs, other.lookbackMs);
      acc.maxItems = Math.max(acc.maxItems, other.maxItems);
    }
  }

  @Override
  public Row getValue(Cut acc) {
    List<String> items = new ArrayList<>();
    List<String> types = new ArrayList<>();
    List<Long> ages = new ArrayList<>();
    for (int k = 0; k < acc.items.length && items.size() < acc.maxItems; k++) {
      long age = acc.impressionMs - acc.times[k];
      if (age > 0 && age <= acc.lookbackMs) {
        items.add(acc.items[k]);
        types.add(acc.types[k]);
        ages.add(age);
      }
    }
    return Row.of(items.toArray(new String[0]), types.toArray(new String[0]), ages.toArray(new Long[0]));
  }
}
