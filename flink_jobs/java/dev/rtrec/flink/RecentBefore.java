package dev.rtrec.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.data.ArrayData;
import org.apache.flink.table.data.GenericArrayData;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.functions.AggregateFunction;

/**
 * A sample's recent engagements: over the rows of one impression, the user's list as of the
 * impression time ({@link RecentEngagements}, carried by one of the rows), cut to the engagements
 * strictly before the impression and within the lookback, at most {@code maxItems}, with their ages.
 * Rows without a list add nothing; no list gives empty arrays.
 *
 * <p>Every row of an impression carries its time, so the list is cut where it arrives, and the
 * accumulator holds only the cut: a RAW value, which the window state keeps as it is, with the ids as
 * their UTF-8 bytes. Arguments and result are Flink's own data structures. With a structured
 * accumulator of Java strings, every row of every impression converted the list to Java strings and
 * back, about 6 % of the job's time.
 */
@FunctionHint(
    accumulator = @DataTypeHint(value = "RAW", bridgedTo = RecentBefore.Cut.class),
    output = @DataTypeHint(
        value = "ROW<items ARRAY<STRING NOT NULL> NOT NULL, types ARRAY<STRING NOT NULL> NOT NULL, "
            + "ages_ms ARRAY<BIGINT NOT NULL> NOT NULL>",
        bridgedTo = RowData.class))
public class RecentBefore extends AggregateFunction<RowData, RecentBefore.Cut> {

  private static final byte[][] NONE = new byte[0][];

  /** The cut list: items and types as UTF-8 bytes, and each one's age at the impression. */
  public static class Cut {
    public byte[][] items = NONE;
    public byte[][] types = NONE;
    public long[] ages = new long[0];
  }

  @Override
  public Cut createAccumulator() {
    return new Cut();
  }

  public void accumulate(Cut acc,
      @DataTypeHint(value = "ARRAY<STRING>", bridgedTo = ArrayData.class) ArrayData items,
      @DataTypeHint(value = "ARRAY<STRING>", bridgedTo = ArrayData.class) ArrayData types,
      @DataTypeHint(value = "ARRAY<BIGINT>", bridgedTo = ArrayData.class) ArrayData times,
      Long impressionMs, Long lookbackMs, Integer maxItems) {
    if (items == null || types == null || times == null || impressionMs == null || lookbackMs == null
        || maxItems == null) {
      return;
    }
    int n = Math.min(items.size(), Math.min(types.size(), times.size()));
    byte[][] keptItems = new byte[Math.min(n, Math.max(maxItems, 0))][];
    byte[][] keptTypes = new byte[keptItems.length][];
    long[] ages = new long[keptItems.length];
    int kept = 0;
    for (int k = 0; k < n && kept < keptItems.length; k++) {
      if (items.isNullAt(k) || types.isNullAt(k) || times.isNullAt(k)) {
        continue;
      }
      long age = impressionMs - times.getLong(k);
      if (age > 0 && age <= lookbackMs) {
        keptItems[kept] = items.getString(k).toBytes();  // a copy: the row's memory is reused
        keptTypes[kept] = types.getString(k).toBytes();
        ages[kept] = age;
        kept++;
      }
    }
    acc.items = java.util.Arrays.copyOf(keptItems, kept);
    acc.types = java.util.Arrays.copyOf(keptTypes, kept);
    acc.ages = java.util.Arrays.copyOf(ages, kept);
  }

  public void merge(Cut acc, Iterable<Cut> others) {
    for (Cut other : others) {
      if (other.items.length > 0) {
        acc.items = other.items;
        acc.types = other.types;
        acc.ages = other.ages;
      }
    }
  }

  @Override
  public RowData getValue(Cut acc) {
    return GenericRowData.of(new GenericArrayData(strings(acc.items)), new GenericArrayData(strings(acc.types)),
        new GenericArrayData(acc.ages.clone()));
  }

  private static StringData[] strings(byte[][] utf8) {
    StringData[] out = new StringData[utf8.length];
    for (int k = 0; k < utf8.length; k++) {
      out[k] = StringData.fromBytes(utf8[k]);
    }
    return out;
  }
}
