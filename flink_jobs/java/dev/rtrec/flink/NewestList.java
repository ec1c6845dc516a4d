package dev.rtrec.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.AggregateFunction;
import org.apache.flink.types.Row;

/**
 * The newest of several versions of a user's list ({@link RecentEngagements}), as the online store
 * keeps one per user and window: the version whose newest entry is latest; among versions of the same
 * millisecond, the one with more entries at it, then the longer. Every version is the head of one
 * prefix of the user's engagements, so that is the version after the most of them, whatever the order
 * the versions (or partial aggregates) arrive in.
 */
@FunctionHint(output = @DataTypeHint(
    "ROW<items ARRAY<STRING NOT NULL> NOT NULL, types ARRAY<STRING NOT NULL> NOT NULL, "
        + "times_ms ARRAY<BIGINT NOT NULL> NOT NULL>"))
public class NewestList extends AggregateFunction<Row, NewestList.Newest> {

  /** The newest version seen so far. */
  public static class Newest {
    public String[] items = new String[0];
    public String[] types = new String[0];
    public long[] times = new long[0];
  }

  @Override
  public Newest createAccumulator() {
    return new Newest();
  }

  public void accumulate(Newest acc, String[] items, String[] types, Long[] times) {
    if (items == null || types == null || times == null || times.length == 0) {
      return;
    }
    long[] plain = new long[times.length];
    for (int k = 0; k < times.length; k++) {
      plain[k] = times[k];
    }
    take(acc, items, types, plain);
  }

  public void merge(Newest acc, Iterable<Newest> others) {
    for (Newest other : others) {
      take(acc, other.items, other.types, other.times);
    }
  }

  private static int atNewest(long[] times) {
    int n = 0;
    while (n < times.length && times[n] == times[0]) {
      n++;
    }
    return n;
  }

  private static void take(Newest acc, String[] items, String[] types, long[] times) {
    if (times.length == 0) {
      return;
    }
    if (acc.times.length > 0) {
      if (times[0] != acc.times[0]) {
        if (times[0] < acc.times[0]) {
          return;
        }
      } else {
        int mine = atNewest(acc.times);
        int theirs = atNewest(times);
        if (theirs < mine || (theirs == mine && times.length <= acc.times.length)) {
          return;
        }
      }
    }
    acc.items = items.clone();
    acc.types = types.clone();
    acc.times = times.clone();
  }

  @Override
  public Row getValue(Newest acc) {
    Long[] times = new Long[acc.times.length];
    for (int k = 0; k < times.length; k++) {
      times[k] = acc.times[k];
    }
    return Row.of(acc.items.clone(), acc.types.clone(), times);
  }
}
