package dev.rtrec.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;
import org.apache.flink.types.Row;

/**
 * A user's newest engagements, newest first: an aggregate over the user's engagements (an OVER
 * window) that keeps at most {@code maxItems} (item, type, time) of them, by time. Its rows are the
 * versions of the user's list, which impressions look up as of their own time ({@link RecentBefore}).
 *
 * <p>Ties in time are broken by item, then type, so a replay gives the same list whatever the order
 * the rows arrived in. The state is bounded by {@code maxItems} per user.
 */
@FunctionHint(output = @DataTypeHint(
    "ROW<items ARRAY<STRING NOT NULL> NOT NULL, types ARRAY<STRING NOT NULL> NOT NULL, "
        + "times_ms ARRAY<BIGINT NOT NULL> NOT NULL>"))
public class RecentEngagements extends AggregateFunction<Row, RecentEngagements.Recent> {

  /** The kept engagements, newest first. */
  public static class Recent {
    public String[] items = new String[0];
    public String[] types = new String[0];
    public long[] times = new long[0];
    public int maxItems;
  }

  @Override
  public Recent createAccumulator() {
    return new Recent();
  }

  public void accumulate(Recent acc, String item, String type, Long timeMs, Integer maxItems) {
    if (maxItems != null) {
      acc.maxItems = maxItems;
    }
    if (item == null || type == null || timeMs == null) {
      return;
    }
    insert(acc, item, type, timeMs, acc.maxItems);
  }

  public void merge(Recent acc, Iterable<Recent> others) {
    for (Recent other : others) {
      acc.maxItems = Math.max(acc.maxItems, other.maxItems);
      for (int k = 0; k < other.items.length; k++) {
        insert(acc, other.items[k], other.types[k], other.times[k], acc.maxItems);
      }
    }
  }

  private static boolean newer(long time, String item, String type, long otherTime, String otherItem,
      String otherType) {
    if (time != otherTime) {
      return time > otherTime;
    }
    int byItem = item.compareTo(otherItem);
    return byItem != 0 ? byItem < 0 : type.compareTo(otherType) < 0;
  }

  private static void insert(Recent acc, String item, String type, long timeMs, int maxItems) {
    int n = acc.items.length;
    int at = 0;
    while (at < n && !newer(timeMs, item, type, acc.times[at], acc.items[at], acc.types[at])) {
      at++;
    }
    if (at >= maxItems) {
      return;
    }
    int size = Math.min(n + 1, maxItems);
    String[] items = new String[size];
    String[] types = new String[size];
    long[] times = new long[size];
    for (int k = 0, from = 0; k < size; k++) {
      if (k == at) {
        items[k] = item;
        types[k] = type;
        times[k] = timeMs;
      } else {
        items[k] = acc.items[from];
        types[k] = acc.types[from];
        times[k] = acc.times[from];
        from++;
      }
    }
    acc.items = items;
    acc.types = types;
    acc.times = times;
  }

  @Override
  public Row getValue(Recent acc) {
    Long[] times = new Long[acc.times.length];
    for (int k = 0; k < times.length; k++) {
      times[k] = acc.times[k];
    }
    return Row.of(acc.items.clone(), acc.types.clone(), times);
  }
}
