package dev.rtrec.flink.features;

import org.apache.flink.streaming.api.TimerService;

/** The event-time timers an entity's tiles need. */
final class Timers {
  private Timers() {}

  /**
   * For the tiles an event opened (bits of their length indexes): one at each one's end, where the
   * features topic gets it; and one where the longest of them is no longer read, to drop the state of
   * an entity that went quiet.
   */
  static void opened(TimerService timers, FeatureSpec spec, int opened, long timeMs, long retentionMs) {
    if (opened == 0) {
      return;
    }
    long lastEnd = Long.MIN_VALUE;
    for (int k = 0; k < spec.tileLengths.length; k++) {
      if ((opened & (1 << k)) != 0) {
        long length = spec.tileLengths[k];
        long end = timeMs - Math.floorMod(timeMs, length) + length;
        timers.registerEventTimeTimer(end);
        lastEnd = Math.max(lastEnd, end);
      }
    }
    if (retentionMs > 0) {
      timers.registerEventTimeTimer(lastEnd + retentionMs);
    }
  }
}
