package dev.rtrec.flink.features;

import org.apache.flink.streaming.api.TimerService;

/** The event-time timers an entity's tiles need. */
final class Timers {
  private Timers() {}

  /**
   * For the tiles an event opened (bits of their length indexes): one at each one's end, where the
   * features topic gets it; and, when it opened a tile of the longest length, one where that tile is
   * no longer read, to drop the state of an entity that went quiet (every shorter tile in it ends
   * before it, so one such timer per longest tile does).
   */
  static void opened(TimerService timers, FeatureSpec spec, int opened, long timeMs, long retentionMs) {
    if (opened == 0) {
      return;
    }
    int longest = spec.tileLengths.length - 1;
    long longestEnd = timeMs - Math.floorMod(timeMs, spec.tileLengths[longest]) + spec.tileLengths[longest];
    for (int k = 0; k <= longest; k++) {
      if ((opened & (1 << k)) != 0) {
        long length = spec.tileLengths[k];
        long end = timeMs - Math.floorMod(timeMs, length) + length;
        timers.registerEventTimeTimer(end);
        // a shorter tile can outlast the longest one only where the lengths do not nest
        if (retentionMs > 0 && (k == longest || end > longestEnd)) {
          timers.registerEventTimeTimer(end + retentionMs);
        }
      }
    }
  }
}
